/* Sleeps in read(2) on stdin, echoing what it reads, until EOF. */
#include "papirus_target.h"

int main(void) { return echo_stdin(); }
