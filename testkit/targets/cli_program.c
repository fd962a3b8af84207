/* The papirus-probe command-line tests' program: calls the cli_lib functions
   and its own, then ends as argv[1] says: a code ("0", "5"), "segv", "abort",
   "loop" (runs until killed, for attach) or "fork" (a child calls main_twice
   too, then both exit 0). Built with gcc -O2. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

long lib_a(long), lib_b(long), lib_c(long), lib_d(long);
volatile long main_sink;

__attribute__((noinline)) long main_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += lib_a(i) + lib_b(i) + lib_c(i) + lib_d(i);
    main_sink += s;
    return s;
}

__attribute__((noinline)) long main_twice(long n) { return main_work(n) + main_work(n); }

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "0";
    main_twice(10);
    puts("cli_program output");
    fflush(stdout);
    if (strcmp(how, "segv") == 0) raise(SIGSEGV);
    if (strcmp(how, "abort") == 0) abort();
    if (strcmp(how, "fork") == 0) {
        pid_t child = fork();
        main_twice(10);
        if (child == 0) exit(0);
        waitpid(child, 0, 0);
        return 0;
    }
    if (strcmp(how, "loop") == 0)
        for (;;) {
            main_twice(10);
            usleep(1000);
        }
    return atoi(how);
}
