/* newt demo: not built yet (issue 2). */
#include <stdio.h>

#include "cli/cmds.h"

int newt_cmd_demo(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt demo: not built yet (issue 2)\n");
  return 2;
}
