# Each of launch's libraries is its own include root: a folder in the build tree that holds one
# link, <folder> -> the library's source folder, so that `#include "<folder>/x.h"` reaches that
# library's headers and nothing else. A target sees a library's headers only by linking it, so an
# include that crosses the layers the wrong way (probes/ reaching into agent/) does not build.
# (The project root is on no library's include path.) The layers, lowest first:
#   common < probes < rendezvous < agent < doctor < launcher
# tests/layout/check_layers.py checks the same order over headers that no source file compiles.
function(launch_include_root target folder)
  set(root ${CMAKE_BINARY_DIR}/include_roots/${folder})
  file(MAKE_DIRECTORY ${root})
  # Relative, so that the link holds where the tree is mounted elsewhere (scripts/in_root.sh).
  file(RELATIVE_PATH rel ${root} ${PROJECT_SOURCE_DIR}/${folder})
  file(CREATE_LINK ${rel} ${root}/${folder} SYMBOLIC)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE ${root})
  else()
    target_include_directories(${target} PUBLIC ${root})
  endif()
endfunction()
