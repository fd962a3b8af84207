/* Tiny functions for the per-call cost bench; gcc -O2. */
#define TINY_BODY { int r = (x ^ y) * 3; __asm__ volatile("" : "+r"(r)); return r + (x >> 2); }

/* Patched with a trampoline. */
__attribute__((noinline)) int tiny(int x, int y) TINY_BODY
/* Never patched: the baseline. */
__attribute__((noinline)) int tiny_ref(int x, int y) TINY_BODY
/* Probed with uprobe+uretprobe (a typical -O2 entry: the kernel single-steps it). */
__attribute__((noinline)) int tiny_up(int x, int y) TINY_BODY

/* The same body behind a 5-byte nop, the kernel's fastest uprobe case. */
__asm__(".text\n.globl tiny_nop5\n.type tiny_nop5,@function\n.p2align 4\ntiny_nop5:\n"
        ".byte 0x0f,0x1f,0x44,0x00,0x00\n"
        "xor %edi,%esi\nlea (%rsi,%rsi,2),%eax\nsar $2,%edi\nadd %edi,%eax\nret\n"
        ".size tiny_nop5,.-tiny_nop5\n");

/* Calls fn n times, feeding results back so no call can be elided. */
long drive(int (*fn)(int, int), long n) {
    long acc = 0;
    for (long i = 0; i < n; i++) acc += fn((int)i, (int)acc);
    return acc;
}
