/* newt data: not built yet (issue 4). */
#include <stdio.h>

#include "cli/cmds.h"

int newt_cmd_data(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt data: not built yet (issue 4)\n");
  return 2;
}
