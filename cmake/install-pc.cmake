# Run by `cmake --install` (install.cmake sets the MOE_PC_* values): writes libmoe.pc (libmoe.so) and
# libmoe-static.pc (libmoe.a) for the prefix being installed into.
cmake_path(ABSOLUTE_PATH MOE_PC_LIBDIR BASE_DIRECTORY "${CMAKE_INSTALL_PREFIX}" NORMALIZE OUTPUT_VARIABLE libdir)
# Programs linked to libmoe.so find it without LD_LIBRARY_PATH when it is not in a system directory.
list(FIND MOE_PC_SYSTEM_DIRS "${libdir}" system)
set(rpath "")
if(system EQUAL -1)
  set(rpath " -Wl,-rpath,\${libdir}")
endif()
set(MOE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(dir LIBDIR INCLUDEDIR)
  if(NOT IS_ABSOLUTE "${MOE_PC_${dir}}")
    set(MOE_PC_${dir} "\${prefix}/${MOE_PC_${dir}}")
  endif()
endforeach()

macro(moe_write_pc name libs)
  set(MOE_PC_NAME ${name})
  set(MOE_PC_LIBS "${libs}")
  set(dest "${libdir}/pkgconfig/${name}.pc")
  message(STATUS "Installing: $ENV{DESTDIR}${dest}")
  configure_file("${MOE_PC_TEMPLATE}" "$ENV{DESTDIR}${dest}" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${dest}")   # without DESTDIR, as cmake's own entries
endmacro()
moe_write_pc(libmoe "-L\${libdir} -lmoe${rpath}")
moe_write_pc(libmoe-static "\${libdir}/libmoe.a")
