/* newt run: not built yet (issue 6). */
#include <stdio.h>

#include "cli/cmds.h"

int newt_cmd_run(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt run: not built yet (issue 6)\n");
  return 2;
}
