// A C++ program whose exceptions cross three frames, one with a destructor.
// g++ -O2 -o probe_program_exc probe_program_exc.cpp
#include <cstdio>

volatile long csink;
static long destroyed;

struct Guard {
    ~Guard() { destroyed++; }
};

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
__attribute__((noinline)) int run(int n) {
    try {
        ex1(n);
        return 0;
    } catch (int v) {
        return v;
    }
}

int main() {
    int sum = 0;
    for (int i = 0; i < 6; i++) sum += run(i % 3);
    std::printf("sum=%d destroyed=%ld\n", sum, destroyed);
    return 0;
}
