/* libnewt.so's own translation unit: the library is the worker and the folders below it,
 * linked whole (lib/CMakeLists.txt); this file adds nothing but the header's check that it
 * compiles on its own. */
#include "newt.h"

typedef int newt_lib_unit; /* a translation unit is not empty */
