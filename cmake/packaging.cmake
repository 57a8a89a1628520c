# What `cmake --install` puts beside the targets' own rules, and the Debian packages CPack makes
# of it all (scripts/test_package.sh installs them with apt-get in a fresh Debian 12 root):
#   launch          (component launch) bin/launch, its man page and bash completion, the Python
#                   module launch_progress, the README with docs/ and bench/README.md beside it
#                   (the README links to them)
#   launch-sdk-dev  (component sdk) worker_sdk: headers, static libraries, the CMake package
#                   config for find_package(LaunchSDK)
# Install rules without a COMPONENT belong to launch, those of worker_sdk/ to sdk
# (CMAKE_INSTALL_DEFAULT_COMPONENT_NAME in the top-level CMakeLists.txt).
include(GNUInstallDirs)

# The man page and completion run the freshly built launch at build time, which the sanitizer
# and fuzzer builds have no use for.
if(LAUNCH_SANITIZE OR LAUNCH_FUZZ)
  set(_launch_docs_default OFF)
else()
  set(_launch_docs_default ON)
endif()
option(LAUNCH_BUILD_DOCS
  "Make launch's man page (help2man), bash completion and docs/cli.md from launch --help" ${_launch_docs_default})
# Where the Python module goes: Debian's python3 reads /usr/lib/python3/dist-packages (the
# package's prefix); under /usr/local it reads lib/python3.<minor>/dist-packages instead.
set(LAUNCH_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
  "Directory under the prefix for the Python module launch_progress")
# The subcommands, which `launch --help` does not list (gen_docs.cmake checks each one's help;
# tests/docs reads this list too).
set(LAUNCH_SUBCOMMANDS coordinator status doctor)

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT launch)
# The committed docs (docs/cli.md equals the generated one: tests/docs), where the README's links
# lead.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT launch
  FILES_MATCHING PATTERN "*.md")
install(FILES ${PROJECT_SOURCE_DIR}/bench/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/bench COMPONENT launch)
# Also where launch itself looks (share/launch/python, launcher/CMakeLists.txt): that copy goes on
# the workers' PYTHONPATH; this one makes `import launch_progress` work outside launch too.
install(FILES ${PROJECT_SOURCE_DIR}/worker_sdk/python/launch_progress.py
  DESTINATION ${LAUNCH_INSTALL_PYTHONDIR} COMPONENT launch)

if(LAUNCH_BUILD_DOCS)
  string(REPLACE ";" "," _launch_subcommands "${LAUNCH_SUBCOMMANDS}")
  set(_launch_gen ${PROJECT_SOURCE_DIR}/packaging/gen_docs.cmake)
  set(_launch_completion ${CMAKE_BINARY_DIR}/share/bash-completion/completions/launch)
  add_custom_command(OUTPUT ${_launch_completion}
    COMMAND ${CMAKE_COMMAND} -DLAUNCH=$<TARGET_FILE:launch> -DSUBCOMMANDS=${_launch_subcommands}
      -DMODE=completion -DTEMPLATE=${PROJECT_SOURCE_DIR}/packaging/launch.bash-completion.in
      -DOUTPUT=${_launch_completion} -P ${_launch_gen}
    DEPENDS launch ${_launch_gen} ${PROJECT_SOURCE_DIR}/packaging/launch.bash-completion.in
    COMMENT "Making launch's bash completion from launch --help" VERBATIM)
  set(_launch_doc_outputs ${_launch_completion})
  # The CLI reference: build/docs/cli.md, which docs/cli.md must equal (tests/docs says how to copy it).
  set(_launch_cli_md ${CMAKE_BINARY_DIR}/docs/cli.md)
  add_custom_command(OUTPUT ${_launch_cli_md}
    COMMAND ${CMAKE_COMMAND} -DLAUNCH=$<TARGET_FILE:launch> -DSUBCOMMANDS=${_launch_subcommands}
      -DMODE=markdown -DOUTPUT=${_launch_cli_md} -P ${_launch_gen}
    DEPENDS launch ${_launch_gen}
    COMMENT "Making docs/cli.md from launch --help" VERBATIM)
  list(APPEND _launch_doc_outputs ${_launch_cli_md})
  install(FILES ${_launch_completion} DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
    COMPONENT launch)

  find_program(LAUNCH_HELP2MAN help2man)
  find_program(LAUNCH_GZIP gzip)
  if(LAUNCH_HELP2MAN AND LAUNCH_GZIP)
    set(_launch_man ${CMAKE_BINARY_DIR}/share/man/man1/launch.1.gz)
    add_custom_command(OUTPUT ${_launch_man}
      COMMAND ${CMAKE_COMMAND} -DLAUNCH=$<TARGET_FILE:launch> -DSUBCOMMANDS=${_launch_subcommands}
        -DMODE=man -DHELP2MAN=${LAUNCH_HELP2MAN} -DGZIP=${LAUNCH_GZIP} -DVERSION=${PROJECT_VERSION}
        -DOUTPUT=${_launch_man} -DWORK_DIR=${CMAKE_BINARY_DIR}/packaging -P ${_launch_gen}
      DEPENDS launch ${_launch_gen}
      COMMENT "Making launch.1 from launch --help (help2man)" VERBATIM)
    list(APPEND _launch_doc_outputs ${_launch_man})
    install(FILES ${_launch_man} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT launch)
  else()
    message(STATUS "help2man not found: no man page for launch (apt-get install help2man)")
  endif()
  add_custom_target(launch_docs ALL DEPENDS ${_launch_doc_outputs})
endif()

# CPack: one .deb per component, named as Debian would (launch_0.1.0-1_amd64.deb), whose
# dependencies are Debian packages: dpkg-shlibdeps reads the libraries launch links (spdlog, fmt,
# cpp-httplib, the C++ runtime; gRPC, protobuf, abseil and yaml-cpp are linked in statically with
# LAUNCH_STATIC_DEPS), and the SDK names the LibTorch its static library was built against (its
# headers include no Gloo header, so libgloo-dev is needed to build the SDK, not to use it).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME launch)
set(CPACK_PACKAGE_VENDOR "launch")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(LAUNCH_PACKAGE_MAINTAINER "launch developers <launch-dev@example.org>" CACHE STRING
  "Maintainer field of the .deb packages")
set(CPACK_PACKAGE_CONTACT "${LAUNCH_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL launch)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# gzip: packaging took 5 s here instead of xz's 41 s (dpkg's default), for 6.4 MiB instead of
# 4.8 MiB; zstd, as fast, is not a member Debian's tools accept (lintian: malformed-deb-archive).
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
set(CPACK_THREADS 0)
# Stripped binaries; their debug information goes to launch-dbgsym_*.ddeb.
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
set(_launch_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")

set(CPACK_DEBIAN_LAUNCH_PACKAGE_NAME launch)
set(CPACK_DEBIAN_LAUNCH_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_LAUNCH_PACKAGE_RECOMMENDS "python3")
set(CPACK_DEBIAN_LAUNCH_PACKAGE_SUGGESTS "python3-torch, bash-completion")
set(LAUNCH_PY_DIST_DIR ${CPACK_PACKAGING_INSTALL_PREFIX}/${LAUNCH_INSTALL_PYTHONDIR})
set(LAUNCH_PY_SHARE_DIR ${CPACK_PACKAGING_INSTALL_PREFIX}/${CMAKE_INSTALL_DATADIR}/launch/python)
configure_file(${PROJECT_SOURCE_DIR}/packaging/launch.prerm.in ${CMAKE_BINARY_DIR}/packaging/deb/prerm @ONLY
  FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_LAUNCH_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/packaging/deb/prerm)
set(CPACK_COMPONENT_LAUNCH_DISPLAY_NAME "launch")
# The first line is the summary; CPACK_PACKAGE_DESCRIPTION_SUMMARY stays unset, or CPack would put
# it above each component's.
set(CPACK_COMPONENT_LAUNCH_DESCRIPTION "torchrun-compatible launcher for distributed PyTorch training
launch starts and supervises the workers of a distributed training job with
torchrun's flags and worker environment: one node or an elastic multi-node
rendezvous, restarts, hang and straggler detection, per-rank logs and error
files. With the Python progress module launch_progress, a man page and bash
completion.")

if(TARGET worker_sdk)
  list(APPEND CPACK_COMPONENTS_ALL sdk)
  # A static library built against this LibTorch's C++ API: the same major.minor on the user's side.
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _launch_torch_mm "${Torch_VERSION}")
  if(_launch_torch_mm)
    string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\2" _launch_torch_minor "${_launch_torch_mm}")
    string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\1" _launch_torch_major "${_launch_torch_mm}")
    math(EXPR _launch_torch_next "${_launch_torch_minor} + 1")
    set(_launch_torch_dep
      "libtorch-dev (>= ${_launch_torch_mm}), libtorch-dev (<< ${_launch_torch_major}.${_launch_torch_next}~)")
  else()
    set(_launch_torch_dep "libtorch-dev")
  endif()
  set(CPACK_DEBIAN_SDK_PACKAGE_NAME launch-sdk-dev)
  set(CPACK_DEBIAN_SDK_PACKAGE_SECTION libdevel)
  # The SDK links Gloo itself where it wakes Gloo's event loops (worker_sdk/CMakeLists.txt).
  if(LAUNCH_SDK_HAS_GLOO_TCP)
    string(APPEND _launch_torch_dep ", libgloo-dev")
  endif()
  set(CPACK_DEBIAN_SDK_PACKAGE_DEPENDS "${_launch_torch_dep}")
  set(CPACK_DEBIAN_SDK_PACKAGE_RECOMMENDS "launch (= ${_launch_deb_version}), cmake, g++")
  set(CPACK_COMPONENT_SDK_DISPLAY_NAME "launch worker SDK")
  set(CPACK_COMPONENT_SDK_DESCRIPTION "C++ worker SDK for launch, on LibTorch
worker_sdk reads launch's worker environment and sets up training on it: the
c10d process group (Gloo on CPU), DDP, a distributed sampler, AMP, checkpoint
and resume, and per-step progress reports to launch's agent. Headers, static
libraries and a CMake package: find_package(LaunchSDK), then link
LaunchSDK::worker_sdk.")
endif()

set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build/" "/build-[^/]*/" "__pycache__")
include(CPack)
