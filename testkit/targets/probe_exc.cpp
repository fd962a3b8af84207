// The exception chain of papirus_target.h with C names, as a shared library.
extern "C" {
#include "papirus_target.h"
long exc_destroyed() { return destroyed; }
}
