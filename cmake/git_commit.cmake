# Writes OUT (a header defining RLM_GIT_COMMIT) from `git rev-parse --short
# HEAD` in SRC, run at every build so `ringlm version` names the commit the
# binary was built from, not the one the tree was configured at. The file is
# rewritten only when the commit changes, so an unchanged tree relinks
# nothing. Outside a git checkout the commit is "unknown".
set(commit unknown)
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
    OUTPUT_VARIABLE out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND out)
    set(commit ${out})
  endif()
endif()
set(text "#define RLM_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
