# duet_service(EXE LIB [SOURCES generated...] LIBS deps...): a service's logic is the library LIB
# (every .cpp of the calling folder but main.cpp, plus SOURCES), which tests link directly; the
# executable EXE is main.cpp, which only wires LIB to its socket.
function(duet_service exe lib)
  cmake_parse_arguments(S "" "" "SOURCES;LIBS" ${ARGN})
  file(GLOB _sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  list(REMOVE_ITEM _sources ${CMAKE_CURRENT_SOURCE_DIR}/main.cpp)
  if(NOT _sources)  # an area just started has only main.cpp
    set(_sources ${PROJECT_SOURCE_DIR}/services/empty.cpp)
  endif()
  add_library(${lib} ${_sources} ${S_SOURCES})
  target_include_directories(${lib} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${lib} PUBLIC ${S_LIBS})
  add_executable(${exe} main.cpp)
  target_link_libraries(${exe} PRIVATE ${lib} CLI11::CLI11)
endfunction()
