/* newt ckpt: not built yet (issue 5). */
#include <stdio.h>

#include "cli/cmds.h"

int newt_cmd_ckpt(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "newt ckpt: not built yet (issue 5)\n");
  return 2;
}
