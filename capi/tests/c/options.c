/* Options: domain, granularity, inherit, multiplex, attach, library queries. */
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

int main(void) {
    init_or_die();
    PAPI_option_t o;
    CHECK(PAPI_get_opt(PAPI_LIB_VERSION, NULL) == PAPI_VER_CURRENT);
    CHECK(PAPI_get_opt(PAPI_MAX_HWCTRS, NULL) >= 0);
    CHECK(PAPI_get_opt(PAPI_MAX_CPUS, NULL) >= 1);
    CHECK(PAPI_get_opt(PAPI_CLOCKRATE, NULL) > 0);
    CHECK(PAPI_get_opt(PAPI_DEFDOM, NULL) == PAPI_DOM_USER);
    memset(&o, 0, sizeof o);
    CHECK_RC(PAPI_get_opt(PAPI_HWINFO, &o), PAPI_OK);
    CHECK(o.hw_info != NULL && o.hw_info->totalcpus >= 1);
    CHECK_RC(PAPI_set_opt(PAPI_MAX_HWCTRS, &o), PAPI_EINVAL);  /* get only */
    CHECK_RC(PAPI_set_opt(PAPI_DOMAIN, NULL), PAPI_EINVAL);

    int es = PAPI_NULL;
    long long v[1];
    PAPI_create_eventset(&es);
    CHECK_RC(PAPI_set_multiplex(es), PAPI_ENOCMP);              /* bind first */
    CHECK_RC(PAPI_assign_eventset_component(es, 0), PAPI_OK);
    CHECK_RC(PAPI_assign_eventset_component(es, 0), PAPI_EINVAL);
    CHECK_RC(PAPI_add_named_event(es, "perf::PAGE-FAULTS"), PAPI_OK);
    memset(&o, 0, sizeof o);
    o.domain.eventset = es;
    o.domain.domain = PAPI_DOM_USER;
    CHECK_RC(PAPI_set_opt(PAPI_DOMAIN, &o), PAPI_OK);
    memset(&o, 0, sizeof o);
    o.domain.eventset = es;
    CHECK(PAPI_get_opt(PAPI_DOMAIN, &o) == PAPI_DOM_USER);
    o.domain.domain = 0;
    CHECK_RC(PAPI_set_opt(PAPI_DOMAIN, &o), PAPI_EINVAL_DOM);
    CHECK_RC(PAPI_set_multiplex(es), PAPI_OK);
    CHECK(PAPI_get_multiplex(es) == 1);
    CHECK_RC(PAPI_set_multiplex(es), PAPI_EINVAL);              /* already */
    /* Inherit: a child's page faults count for the parent's set. */
    memset(&o, 0, sizeof o);
    o.inherit.eventset = es;
    o.inherit.inherit = PAPI_INHERIT_ALL;
    CHECK_RC(PAPI_set_opt(PAPI_INHERIT, &o), PAPI_OK);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    pid_t pid = fork();
    if (pid == 0) { touch_pages(3000); _exit(0); }
    waitpid(pid, NULL, 0);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    CHECK(v[0] >= 3000);
    KV("inherited_child_faults_at_least_3000", "%d", v[0] >= 3000);
    /* Attach: count another process. */
    int pfd[2], cfd[2];
    if (pipe(pfd) || pipe(cfd)) return 2;
    pid = fork();
    if (pid == 0) {
        char c;
        if (read(pfd[0], &c, 1) != 1) _exit(1);
        touch_pages(2000);
        if (write(cfd[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    int at = PAPI_NULL;
    PAPI_create_eventset(&at);
    CHECK_RC(PAPI_add_named_event(at, "perf::PAGE-FAULTS"), PAPI_OK);
    CHECK_RC(PAPI_attach(at, (unsigned long)pid), PAPI_OK);
    CHECK_RC(PAPI_attach(at, (unsigned long)pid), PAPI_EINVAL);
    int st = 0;
    PAPI_state(at, &st);
    CHECK(st & PAPI_ATTACHED);
    CHECK_RC(PAPI_start(at), PAPI_OK);
    char c;
    if (write(pfd[1], "x", 1) != 1 || read(cfd[0], &c, 1) != 1) return 2;
    CHECK_RC(PAPI_stop(at, v), PAPI_OK);
    kill(pid, 9);
    waitpid(pid, NULL, 0);
    CHECK(v[0] >= 2000);
    CHECK_RC(PAPI_detach(at), PAPI_OK);
    CHECK_RC(PAPI_detach(at), PAPI_EINVAL);
    /* Defaults for new sets. */
    CHECK_RC(PAPI_set_domain(0), PAPI_EINVAL);
    CHECK_RC(PAPI_set_granularity(3), PAPI_EINVAL);
    CHECK_RC(PAPI_set_granularity(PAPI_GRN_THR), PAPI_OK);
    return finish("options");
}
