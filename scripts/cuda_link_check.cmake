# Included after every project() (CMAKE_PROJECT_INCLUDE) by scripts/build_cuda.sh only: what it
# takes to compile and link against Debian 13's CUDA LibTorch 2.6 (built for CUDA 12.4) on a
# machine that has a CUDA 13 toolkit and no CUDA 12 runtime. Nothing here is needed where the
# toolkit matches the LibTorch (the GPU check builds against torch's own CMake prefix without it).

# CUDA 13 dropped the NVTX2 library (libnvToolsExt); Caffe2's cuda.cmake still names its target.
if(NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
endif()
# libtorch_cuda.so needs libcudart.so.12, libcublas.so.12, libcudnn.so.9, ... which are not
# installed: their symbols are left to the dynamic loader of a machine that has them. Symbols
# that our own objects leave undefined are still errors.
add_link_options(LINKER:--unresolved-symbols=ignore-in-shared-libs)
