# Install rules: libmoe.so (versioned) and libmoe.a, moe.h, the moe CLI, pkg-config files
# (libmoe, libmoe-static), a CMake package: find_package(libmoe) gives libmoe::moe (libmoe.so)
# and libmoe::moe_static (libmoe.a); and the Python package where python3 is found.
include(CMakePackageConfigHelpers)

# Installed libmoe.so and moe run with the run path they are built with: the OpenMP OpenBLAS
# (CMAKE_INSTALL_RPATH) and any other non-system library directory (Open MPI's); nothing to rewrite.
set_target_properties(moe moe_shared PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON BUILD_WITH_INSTALL_RPATH ON)

set_target_properties(moe_shared PROPERTIES EXPORT_NAME moe)
set_target_properties(moe_static PROPERTIES EXPORT_NAME moe_static)
install(TARGETS moe_shared moe_static EXPORT libmoe-targets INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS moe)
install(FILES include/moe.h TYPE INCLUDE)

# Built with MPI: the package config finds it, libmoe.pc requires it.
set(MOE_FIND_MPI "")
set(MOE_PC_REQUIRES "libcjson libpcre2-8 libutf8proc")
if(MPI_C_FOUND)
  set(MOE_FIND_MPI "find_dependency(MPI COMPONENTS C)")
  string(APPEND MOE_PC_REQUIRES " mpi-c")
endif()

set(MOE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/libmoe)
install(EXPORT libmoe-targets NAMESPACE libmoe:: DESTINATION ${MOE_CMAKE_DIR})
configure_package_config_file(cmake/libmoe-config.cmake.in ${CMAKE_BINARY_DIR}/libmoe-config.cmake
                              INSTALL_DESTINATION ${MOE_CMAKE_DIR})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/libmoe-config-version.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/libmoe-config.cmake ${CMAKE_BINARY_DIR}/libmoe-config-version.cmake
        DESTINATION ${MOE_CMAKE_DIR})

# pkg-config: what a static link needs besides libmoe.a. The OpenBLAS is the OpenMP build, pinned by
# directory and run path (Debian's alternatives, and so its openblas.pc, may name the pthreads one);
# oneDNN has no .pc.
get_filename_component(MOE_DNNL_DIR ${DNNL_LIB} DIRECTORY)
set(MOE_PC_LIBS_PRIVATE "-L${MOE_OPENBLAS_DIR} -Wl,-rpath,${MOE_OPENBLAS_DIR} -lopenblas -L${MOE_DNNL_DIR} -ldnnl ${OpenMP_C_FLAGS} -lmvec -lm")
# The .pc files name the prefix `cmake --install` installs into (--prefix may change it after
# configuring), so cmake/install-pc.cmake writes them then, from these values.
install(CODE "
  set(MOE_PC_TEMPLATE [[${CMAKE_SOURCE_DIR}/cmake/libmoe.pc.in]])
  set(MOE_PC_VERSION [[${PROJECT_VERSION}]])
  set(MOE_PC_LIBDIR [[${CMAKE_INSTALL_LIBDIR}]])
  set(MOE_PC_INCLUDEDIR [[${CMAKE_INSTALL_INCLUDEDIR}]])
  set(MOE_PC_REQUIRES [[${MOE_PC_REQUIRES}]])
  set(MOE_PC_LIBS_PRIVATE [[${MOE_PC_LIBS_PRIVATE}]])
  set(MOE_PC_SYSTEM_DIRS [[${CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES};${CMAKE_C_IMPLICIT_LINK_DIRECTORIES}]])")
install(SCRIPT cmake/install-pc.cmake)

# The Python package (pure Python over libmoe.so with ctypes) into lib/python3.X/dist-packages, the
# directory Debian's python3 searches under /usr/local; _installed.py tells it where libmoe.so.0 is,
# relative to itself, so that the tree may move (or be staged with DESTDIR).
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3) # Debian's, which sees python3-numpy and python3-torch
endif()
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_FOUND)
  set(MOE_INSTALL_PYTHONDIR "lib/python3.${Python3_VERSION_MINOR}/dist-packages" CACHE STRING
      "where cmake --install puts the Python package libmoe (relative to the prefix)")
  install(DIRECTORY python/libmoe DESTINATION ${MOE_INSTALL_PYTHONDIR} PATTERN __pycache__ EXCLUDE)
  file(RELATIVE_PATH MOE_PY_TO_LIB /prefix/${MOE_INSTALL_PYTHONDIR}/libmoe /prefix/${CMAKE_INSTALL_LIBDIR})
  file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/python/_installed.py CONTENT
       "# Written by CMake: the directory of libmoe.so.0, relative to this package's.\nLIBDIR = \"@MOE_PY_TO_LIB@\"\n")
  install(FILES ${CMAKE_BINARY_DIR}/python/_installed.py DESTINATION ${MOE_INSTALL_PYTHONDIR}/libmoe)
endif()
