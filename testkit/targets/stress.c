/* Stress target for attach/detach: `stress MODE...` runs the given modes until
 * stdin reaches EOF, each verifying what it computes, then prints one line per
 * mode, "ok MODE N" (N = rounds done) or "FAIL MODE reason", and exits 0 only
 * when every mode passed. Any EINTR a mode sees is a failure.
 *
 * Modes: threads (about 1,000 threads created and joined per second), fork,
 * vfork (vfork + exec of /bin/true), exec (execs itself every 200 ms; the count
 * of images is carried in argv), coro (swapcontext), longjmp, alarm (SIGALRM
 * every 1 ms, the handler calls instrumented functions), altstack (the same on
 * a sigaltstack), sleep (a thread in 20 ms nanosleeps, each checked to last its
 * full length), read (a thread blocked in read on a pipe), all. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile int stop;
static char failure[32][160];
static int nfail;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *mode, const char *why) {
    pthread_mutex_lock(&fail_lock);
    if (nfail < 32) snprintf(failure[nfail++], sizeof failure[0], "FAIL %s %s", mode, why);
    pthread_mutex_unlock(&fail_lock);
}

static void eintr(const char *mode, const char *call) {
    char why[64];
    snprintf(why, sizeof why, "EINTR from %s", call);
    fail(mode, why);
}

/* The functions worth instrumenting: small, called from everywhere. */
NOINLINE long leaf(long x) { return x * 3 + 1; }
NOINLINE long mid(long x) { return leaf(x) + leaf(x + 1); }
static long expect_mid(long x) { return (x * 3 + 1) + ((x + 1) * 3 + 1); }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- threads ---- */
static void *thread_body(void *a) { return (void *)mid((long)a); }

NOINLINE static long mode_threads(void) {
    long rounds = 0;
    while (!stop) {
        pthread_t t[10];
        for (long i = 0; i < 10; i++)
            if (pthread_create(&t[i], 0, thread_body, (void *)i)) { fail("threads", "pthread_create"); return rounds; }
        for (long i = 0; i < 10; i++) {
            void *r;
            pthread_join(t[i], &r);
            if ((long)r != expect_mid(i)) { fail("threads", "wrong value from a thread"); return rounds; }
        }
        /* 10 threads per 10 ms: about 1,000 a second. */
        struct timespec d = {0, 10 * 1000 * 1000};
        while (nanosleep(&d, &d) == -1)
            if (errno == EINTR) { eintr("threads", "nanosleep"); break; }
        rounds++;
    }
    /* Exactly this thread and the stdin reader are left. */
    return rounds;
}

/* ---- fork and vfork ---- */
NOINLINE static long mode_fork(int use_vfork) {
    const char *mode = use_vfork ? "vfork" : "fork";
    long rounds = 0;
    while (!stop) {
        pid_t c = use_vfork ? vfork() : fork();
        if (c == 0) {
            if (use_vfork) {
                execl("/bin/true", "true", (char *)0);
                _exit(126);
            }
            _exit((int)(mid(rounds) & 0x7f));
        }
        if (c < 0) { fail(mode, "fork failed"); return rounds; }
        int st;
        while (waitpid(c, &st, 0) == -1)
            if (errno == EINTR) { eintr(mode, "waitpid"); return rounds; }
        int want = use_vfork ? 0 : (int)(expect_mid(rounds) & 0x7f);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != want) {
            char why[64];
            snprintf(why, sizeof why, "child ended with status %#x, not exit %d", st, want);
            fail(mode, why);
            return rounds;
        }
        usleep(2000);
        rounds++;
    }
    return rounds;
}

/* ---- coroutines ---- */
static ucontext_t main_ctx, coro_ctx;
static long coro_value;

NOINLINE static void coro_fn(void) {
    for (long i = 0;; i++) {
        coro_value = mid(i);
        swapcontext(&coro_ctx, &main_ctx);
    }
}

NOINLINE static long mode_coro(void) {
    static char stack[256 * 1024];
    getcontext(&coro_ctx);
    coro_ctx.uc_stack.ss_sp = stack;
    coro_ctx.uc_stack.ss_size = sizeof stack;
    coro_ctx.uc_link = 0;
    makecontext(&coro_ctx, coro_fn, 0);
    long rounds = 0;
    while (!stop) {
        swapcontext(&main_ctx, &coro_ctx);
        if (coro_value != expect_mid(rounds)) { fail("coro", "wrong value from the coroutine"); return rounds; }
        rounds++;
    }
    return rounds;
}

/* ---- longjmp ---- */
static jmp_buf jb;
NOINLINE static long dive(long depth, long x) {
    if (depth <= 0) longjmp(jb, (int)(leaf(x) & 0xffff) + 1);
    return dive(depth - 1, x) + 1;
}

NOINLINE static long mode_longjmp(void) {
    volatile long rounds = 0;
    while (!stop) {
        volatile long x = rounds & 0xfff;
        int r = setjmp(jb);
        if (r == 0) dive(8, x);
        if (r != (int)((x * 3 + 1) & 0xffff) + 1) { fail("longjmp", "wrong value through longjmp"); return rounds; }
        rounds++;
    }
    return rounds;
}

/* ---- SIGALRM, plain and on a sigaltstack ---- */
static volatile long alarms, alarm_bad;
static void on_alarm(int s) {
    (void)s;
    int saved = errno;
    long n = alarms;
    if (mid(n) != expect_mid(n)) alarm_bad++;
    alarms = n + 1;
    errno = saved;
}

NOINLINE static long mode_alarm(int alt) {
    const char *mode = alt ? "altstack" : "alarm";
    if (alt) {
        stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16};
        if (sigaltstack(&ss, 0)) { fail(mode, "sigaltstack"); return 0; }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART | (alt ? SA_ONSTACK : 0);
    sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, 0);
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_UNBLOCK, &alrm, 0);
    long rounds = 0;
    while (!stop) {
        if (mid(rounds) != expect_mid(rounds)) { fail(mode, "wrong value in the main loop"); break; }
        rounds++;
    }
    /* A loaded machine may end a short run before the first tick: wait up to 1 s for one. */
    for (int i = 0; i < 1000 && alarms == 0; i++) usleep(1000);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    if (alarm_bad) fail(mode, "wrong value in the handler");
    if (alarms == 0) fail(mode, "no SIGALRM handled");
    return rounds;
}

/* ---- a thread sleeping in nanosleep ---- */
static void *sleeper(void *a) {
    long *rounds = a;
    while (!stop) {
        struct timespec d = {0, 20 * 1000 * 1000};
        double t0 = now();
        if (nanosleep(&d, 0) == -1) {
            if (errno == EINTR) eintr("sleep", "nanosleep");
            else fail("sleep", strerror(errno));
            return 0;
        }
        if (now() - t0 < 0.020) { fail("sleep", "nanosleep(20 ms) returned early"); return 0; }
        ++*rounds;
    }
    return 0;
}

/* ---- a thread blocked in read on a pipe ---- */
static int pipefd[2];
static void *reader(void *a) {
    long *rounds = a;
    for (unsigned char expect = 0;; expect++) {
        unsigned char c;
        ssize_t n = read(pipefd[0], &c, 1);
        if (n == -1) {
            if (errno == EINTR) eintr("read", "read");
            else fail("read", strerror(errno));
            return 0;
        }
        if (n == 0) return 0;
        if (c != expect) { fail("read", "bytes out of order"); return 0; }
        ++*rounds;
    }
}

/* ---- exec of itself ---- */
static long exec_images = 1;
static char **exec_argv;
static void *execer(void *a) {
    (void)a;
    struct timespec d = {0, 200 * 1000 * 1000};
    while (nanosleep(&d, &d) == -1)
        if (errno == EINTR) { eintr("exec", "nanosleep"); return 0; }
    if (stop) return 0;
    char gen[32];
    snprintf(gen, sizeof gen, "--images=%ld", exec_images + 1);
    /* The timer survives execve; the new image handles what is pending once
       its handler is back (SIGALRM stays blocked here, and so in the new image). */
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    char *argv[64];
    int n = 0;
    for (char **p = exec_argv; *p && n < 60; p++)
        if (strncmp(*p, "--images=", 9)) argv[n++] = *p;
    argv[n++] = gen;
    argv[n] = 0;
    execv("/proc/self/exe", argv);
    fail("exec", "execv failed");
    return 0;
}

static void *feeder(void *a) {
    (void)a;
    for (unsigned char c = 0; !stop; c++) {
        if (write(pipefd[1], &c, 1) != 1) { fail("read", "write to the pipe"); break; }
        struct timespec d = {0, 5 * 1000 * 1000};
        while (nanosleep(&d, &d) == -1)
            if (errno == EINTR) { eintr("read", "nanosleep of the writer"); break; }
    }
    close(pipefd[1]);
    return 0;
}

/* ---- stdin: EOF ends every mode ---- */
static void *stdin_watch(void *a) {
    (void)a;
    char buf[64];
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n == 0) break;
        if (n < 0 && errno != EINTR) break;
        if (n < 0) eintr("stdin", "read");
    }
    stop = 1;
    return 0;
}

struct worker {
    const char *mode;
    long rounds;
    pthread_t t;
};

static void *run_mode(void *a) {
    struct worker *w = a;
    if (!strcmp(w->mode, "threads")) w->rounds = mode_threads();
    else if (!strcmp(w->mode, "fork")) w->rounds = mode_fork(0);
    else if (!strcmp(w->mode, "vfork")) w->rounds = mode_fork(1);
    else if (!strcmp(w->mode, "coro")) w->rounds = mode_coro();
    else if (!strcmp(w->mode, "longjmp")) w->rounds = mode_longjmp();
    return 0;
}

int main(int argc, char **argv) {
    exec_argv = argv;
    const char *all[] = {"threads", "fork", "vfork", "coro", "longjmp", "alarm", "sleep", "read", "exec"};
    const char *modes[32];
    int n = 0;
    for (int i = 1; i < argc && n < 20; i++) {
        if (!strncmp(argv[i], "--images=", 9)) exec_images = atol(argv[i] + 9);
        else if (!strcmp(argv[i], "all"))
            for (unsigned k = 0; k < sizeof all / sizeof all[0]; k++) modes[n++] = all[k];
        else modes[n++] = argv[i];
    }
    if (n == 0) { fprintf(stderr, "usage: stress MODE...\n"); return 2; }
    if (pipe(pipefd)) return 2;
    /* Only the main thread takes SIGALRM (its sigaltstack is its own). */
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, 0);
    pthread_t watch;
    pthread_create(&watch, 0, stdin_watch, 0);
    struct worker w[32];
    long sleeps = 0, reads = 0;
    pthread_t sleep_t = 0, read_t = 0, feed_t = 0, exec_t = 0;
    int signal_mode = -1;
    for (int i = 0; i < n; i++) {
        w[i].mode = modes[i];
        w[i].rounds = -1;
        if (!strcmp(modes[i], "sleep")) pthread_create(&sleep_t, 0, sleeper, &sleeps);
        else if (!strcmp(modes[i], "read")) {
            pthread_create(&read_t, 0, reader, &reads);
            pthread_create(&feed_t, 0, feeder, 0);
        }
        else if (!strcmp(modes[i], "exec")) pthread_create(&exec_t, 0, execer, 0);
        else if (!strcmp(modes[i], "alarm") || !strcmp(modes[i], "altstack")) signal_mode = i;
        else pthread_create(&w[i].t, 0, run_mode, &w[i]);
    }
    if (exec_images == 1) {
        printf("ready\n");
        fflush(stdout);
    }
    /* The signal modes run on the main thread, which is the one the timer signals. */
    if (signal_mode >= 0) w[signal_mode].rounds = mode_alarm(!strcmp(modes[signal_mode], "altstack"));
    pthread_join(watch, 0);
    if (feed_t) pthread_join(feed_t, 0);
    else close(pipefd[1]);
    if (sleep_t) pthread_join(sleep_t, 0);
    if (read_t) pthread_join(read_t, 0);
    if (exec_t) pthread_join(exec_t, 0);
    for (int i = 0; i < n; i++) {
        if (!strcmp(modes[i], "sleep")) w[i].rounds = sleeps;
        else if (!strcmp(modes[i], "read")) w[i].rounds = reads;
        else if (!strcmp(modes[i], "exec")) w[i].rounds = exec_images;
        else if (i != signal_mode) pthread_join(w[i].t, 0);
    }
    for (int i = 0; i < nfail; i++) printf("%s\n", failure[i]);
    for (int i = 0; i < n; i++) {
        int failed = 0;
        for (int k = 0; k < nfail; k++)
            if (!strncmp(failure[k] + 5, modes[i], strlen(modes[i])) && failure[k][5 + strlen(modes[i])] == ' ')
                failed = 1;
        if (!failed) printf("ok %s %ld\n", modes[i], w[i].rounds);
    }
    return nfail ? 1 : 0;
}
