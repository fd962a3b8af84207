// A C++ exception thrown through three frames, one with a destructor.
volatile long csink;
volatile long destroyed;

struct Guard {
    ~Guard() { destroyed++; }
};

extern "C" {
__attribute__((noinline)) void ex3(int n) {
    if (n > 0) throw n;
    csink++;
}
__attribute__((noinline)) void ex2(int n) {
    Guard g;
    ex3(n);
    csink++;
}
__attribute__((noinline)) void ex1(int n) {
    ex2(n);
    csink++;
}
__attribute__((noinline)) int run_exc(int n) {
    try {
        ex1(n);
        return 0;
    } catch (int v) {
        return v;
    }
}
long exc_destroyed() { return destroyed; }
}
