/* The cost floor of a return-hijacking probe on this machine, part by part:
 * the same call made plain; through a trampoline shaped like papirus' (the
 * same saves and flag handling) calling a hook that does nothing; with the
 * hook hijacking the return into an exit stub shaped like papirus' (the
 * function's `ret` then always mispredicts); and with one `rdtsc` in each
 * hook. What papirus' wallclock probe costs above the last is its own
 * bookkeeping (thread lookup, shadow stack, call-path tree).
 *
 * Prints one line, "floor PLAIN TRAMPOLINE HIJACK CLOCK", each the median
 * ns per call (thread CPU time) over interleaved rounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))

static uint64_t saved_ret;
static volatile uint64_t sink;

static inline uint64_t rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* Hooks are called from assembly: keep their symbols. */
#define HOOK __attribute__((noinline, used))

/* The exit stub's shape, calling EXIT directly as papirus' stub does. */
#define EXIT_STUB(name, exit)                                   \
    void name(void);                                            \
    __asm__(".text\n" #name ":\n"                               \
            "  lea -8(%rsp), %rsp\n"                            \
            "  push %rax; push %rdx; push %rcx; push %rsi\n"    \
            "  push %rdi; push %r8; push %r9; push %r10\n"      \
            "  push %r11\n"                                     \
            "  lea 80(%rsp), %rdi\n"                            \
            "  call " #exit "\n"                                \
            "  mov %rax, 72(%rsp)\n"                            \
            "  pop %r11; pop %r10; pop %r9; pop %r8\n"          \
            "  pop %rdi; pop %rsi; pop %rcx; pop %rdx\n"        \
            "  pop %rax\n"                                      \
            "  lea 8(%rsp), %rsp\n"                             \
            "  jmp *-8(%rsp)\n");

EXIT_STUB(stub_plain, floor_exit)
EXIT_STUB(stub_clock, floor_exit_clock)

HOOK void floor_enter_nothing(unsigned id, uint64_t *slot) {
    (void)id;
    (void)slot;
    __asm__ volatile("");
}
HOOK void floor_enter_hijack(unsigned id, uint64_t *slot) {
    (void)id;
    saved_ret = *slot;
    *slot = (uint64_t)stub_plain;
}
HOOK void floor_enter_clock(unsigned id, uint64_t *slot) {
    (void)id;
    sink = rdtsc();
    saved_ret = *slot;
    *slot = (uint64_t)stub_clock;
}
HOOK uint64_t floor_exit(uint64_t rsp) {
    (void)rsp;
    return saved_ret;
}
HOOK uint64_t floor_exit_clock(uint64_t rsp) {
    (void)rsp;
    sink = rdtsc();
    return saved_ret;
}

/* `int f(int x) { return x + 1; }` entered through the entry trampoline's
 * shape, which calls HOOK through a pointer beside it, as papirus' does. */
#define TRAMPOLINED(name, hook)                                 \
    int name(int);                                              \
    __asm__(".text\n" #name ":\n"                               \
            "  push %rax; lahf; seto %al; push %rax\n"          \
            "  push %rcx; push %rdx; push %rsi; push %rdi\n"    \
            "  push %r8; push %r9; push %r10; push %r11\n"      \
            "  mov $7, %edi\n"                                  \
            "  lea 80(%rsp), %rsi\n"                            \
            "  call *" #name "_hook(%rip)\n"                    \
            "  pop %r11; pop %r10; pop %r9; pop %r8\n"          \
            "  pop %rdi; pop %rsi; pop %rdx; pop %rcx\n"        \
            "  pop %rax; add $0x7f, %al; sahf; pop %rax\n"      \
            "  lea 1(%rdi), %eax\n"                             \
            "  ret\n"                                           \
            ".pushsection .data.rel.ro\n"                      \
            ".p2align 3\n"                                      \
            #name "_hook: .quad " #hook "\n"                   \
            ".popsection\n");

TRAMPOLINED(f_trampoline, floor_enter_nothing)
TRAMPOLINED(f_hijack, floor_enter_hijack)
TRAMPOLINED(f_clock, floor_enter_clock)

NOINLINE int f_plain(int x) {
    __asm__ volatile("");
    return x + 1;
}

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

#define CALLS 2000000
#define ROUNDS 9

static double per_call(int (*f)(int)) {
    int (*volatile g)(int) = f;
    int s = 0;
    double t = cpu_ns();
    for (int i = 0; i < CALLS; i++) s += g(i);
    t = cpu_ns() - t;
    sink = (uint64_t)s;
    return t / CALLS;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { PLAIN, TRAMPOLINE, HIJACK, CLOCK, ROWS };
    double v[ROWS][ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        v[PLAIN][r] = per_call(f_plain);
        v[TRAMPOLINE][r] = per_call(f_trampoline);
        v[HIJACK][r] = per_call(f_hijack);
        v[CLOCK][r] = per_call(f_clock);
    }
    printf("floor");
    for (int k = 0; k < ROWS; k++) {
        qsort(v[k], ROUNDS, sizeof(double), by_value);
        printf(" %.2f", v[k][ROUNDS / 2]);
    }
    printf("\n");
    return 0;
}
