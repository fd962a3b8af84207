/* fork and exec: the child initialises again and counts its own work;
   the parent's set keeps counting. */
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static int count_own_faults(int pages) {
    int es = PAPI_NULL;
    long long v[1];
    if (PAPI_library_init(PAPI_VER_CURRENT) != PAPI_VER_CURRENT) return 10;
    if (PAPI_create_eventset(&es) != PAPI_OK || PAPI_add_named_event(es, "perf::PAGE-FAULTS") != PAPI_OK) return 11;
    if (PAPI_start(es) != PAPI_OK) return 12;
    touch_pages(pages);
    if (PAPI_stop(es, v) != PAPI_OK) return 13;
    return v[0] >= pages ? 0 : 14;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0) return count_own_faults(1500);
    init_or_die();
    int es = PAPI_NULL, status = 0;
    long long v[1];
    PAPI_create_eventset(&es);
    CHECK_RC(PAPI_add_named_event(es, "perf::PAGE-FAULTS"), PAPI_OK);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    pid_t pid = fork();
    if (pid == 0) _exit(count_own_faults(2000));
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    touch_pages(1000);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    CHECK(v[0] >= 1000);
    CHECK(v[0] < 2000 + 1000);   /* the child's faults are its own */
    pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "exec-child", (char *)NULL);
        _exit(20);
    }
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    KV("fork_exec_children_counted", "%d", failures == 0);
    return finish("forkexec");
}
