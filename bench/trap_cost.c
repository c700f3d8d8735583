// What one uprobe hit costs a thread, directly and through the caches it
// disturbs. Built and run by bench/trap_cost.py, which explains the design.
//
// Each iteration calls probed() once, then chases pointers through a
// working set of W bytes (a random cycle of cache lines, STEPS loads), or,
// for a size written cW, calls STEPS of W/64 generated 64-byte functions in
// a random cycle (a code working set: instruction cache, uop cache, branch
// predictors). ON blocks hold a uprobe on probed() (a counting perf event of
// the uprobe PMU, no BPF, opened on this thread and closed after the block);
// OFF blocks hold none. The thread's CPU time per iteration, ON minus OFF, is
// what one hit costs with that working set: the trap's own path plus the
// refills of what the kernel's entry, handler and exit evicted.
//
//   trap_cost OFFSET BLOCK_MS PAIRS STEPS W|cW...
//
// Prints one line per block: W code on iterations cpu_ns hits.

#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LINE 64

// The probed function, in assembly so that its first instruction is `push
// %rbp` whatever the compiler: x86 uprobes emulate it, as they do every probe
// the default mode keeps in (probe/src/xol.rs), so a hit is one trap.
void probed(void);
__asm__(".text\n.globl probed\n.type probed,@function\nprobed:\n"
        "push %rbp\nmov %rsp,%rbp\npop %rbp\nret\n.size probed,.-probed\n");

static uint64_t now_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int uprobe_type(void) {
    FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int t = -1;
    if (!f || fscanf(f, "%d", &t) != 1) t = -1;
    if (f) fclose(f);
    return t;
}

// A counting uprobe on probed() for this thread only; -1 on failure.
static int open_probe(int type, const char *exe, uint64_t offset) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = (uint32_t)type;
    a.config1 = (uint64_t)(uintptr_t)exe;
    a.config2 = offset;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

// 0..n-1 in a random order (Fisher-Yates).
static void shuffle(size_t *order, size_t n) {
    for (size_t i = 0; i < n; i++) order[i] = i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)random() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

// A random cycle through the buffer's cache lines, so that the hardware
// prefetchers cannot hide the misses.
static void **make_cycle(size_t bytes) {
    size_t n = bytes / LINE;
    if (n < 2) return NULL;
    char *buf = aligned_alloc(4096, n * LINE);
    size_t *order = malloc(n * sizeof *order);
    if (!buf || !order) return NULL;
    shuffle(order, n);
    for (size_t i = 0; i < n; i++)
        *(void **)(buf + order[i] * LINE) = buf + order[(i + 1) % n] * LINE;
    free(order);
    return (void **)buf;
}

// Volatile, so that the chase is not optimised away as dead.
static void *volatile sink;

typedef int (*fn)(int);

// W/64 functions of 64 bytes each: 19 `add $k,%eax` and a `ret`, padded
// with int3, called in a random cycle through a table.
static fn *make_code(size_t bytes, size_t *count) {
    size_t n = bytes / LINE;
    unsigned char *code = mmap(NULL, n * LINE, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fn *table = malloc(n * sizeof *table);
    size_t *order = malloc(n * sizeof *order);
    if (n < 2 || code == MAP_FAILED || !table || !order) return NULL;
    memset(code, 0xcc, n * LINE);
    for (size_t i = 0; i < n; i++) {
        unsigned char *f = code + i * LINE;
        for (int k = 0; k < 19; k++) {
            f[3 * k] = 0x83, f[3 * k + 1] = 0xc0, f[3 * k + 2] = (unsigned char)(i + k);
        }
        f[57] = 0xc3;
    }
    if (mprotect(code, n * LINE, PROT_READ | PROT_EXEC) != 0) return NULL;
    shuffle(order, n);
    for (size_t i = 0; i < n; i++) table[i] = (fn)(void *)(code + order[i] * LINE);
    free(order);
    *count = n;
    return table;
}

struct work {
    void *base;     // data: the buffer
    void **cycle;   //   and the next line to load
    fn *table;      // code: the functions, in call order
    size_t count, next;
};

static void run_block(struct work *w, long steps, uint64_t ms, uint64_t *iters, uint64_t *cpu) {
    void **p = w->cycle;
    int acc = 0;
    uint64_t n = 0, t0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    uint64_t end = t0 + ms * 1000000ull;
    do {
        for (int k = 0; k < 64; k++) {
            probed();
            if (p)
                for (long s = 0; s < steps; s++) p = (void **)*p;
            if (w->table)
                for (long s = 0; s < steps; s++) {
                    acc = w->table[w->next](acc);
                    if (++w->next == w->count) w->next = 0;
                }
        }
        n += 64;
    } while (now_ns(CLOCK_MONOTONIC) < end);
    *cpu = now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    *iters = n;
    w->cycle = p;
    sink = p;
    sink = (void *)(intptr_t)acc;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: trap_cost OFFSET BLOCK_MS PAIRS STEPS W|cW...\n");
        return 2;
    }
    uint64_t offset = strtoull(argv[1], NULL, 0), ms = strtoull(argv[2], NULL, 0);
    int pairs = atoi(argv[3]);
    long steps = atol(argv[4]);
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int type = uprobe_type();
    if (len <= 0 || type < 0) {
        fprintf(stderr, "trap_cost: no /proc/self/exe or no uprobe PMU\n");
        return 1;
    }
    exe[len] = 0;
    for (int w = 5; w < argc; w++) {
        int code = argv[w][0] == 'c';
        size_t bytes = strtoull(argv[w] + code, NULL, 0);
        struct work work = {0};
        if (code && bytes && !(work.table = make_code(bytes, &work.count))) {
            fprintf(stderr, "trap_cost: cannot generate %zu bytes of code\n", bytes);
            return 1;
        }
        // A data set too small for a cycle (under two lines) runs as the
        // empty one; one that could not be allocated must not pass for it.
        if (!code && !(work.base = work.cycle = make_cycle(bytes)) && bytes >= 2 * LINE) {
            fprintf(stderr, "trap_cost: cannot allocate %zu bytes of data\n", bytes);
            return 1;
        }
        uint64_t it, cpu;
        run_block(&work, steps, ms, &it, &cpu);  // warm the working set
        // ON and OFF in ABBA order, so a linear drift cancels.
        for (int b = 0; b < 4 * pairs; b++) {
            int on = (b % 4 == 1 || b % 4 == 2);
            int fd = -1;
            if (on && (fd = open_probe(type, exe, offset)) < 0) {
                perror("trap_cost: perf_event_open(uprobe)");
                return 1;
            }
            run_block(&work, steps, ms, &it, &cpu);
            uint64_t hits = 0;
            if (fd >= 0) {
                if (read(fd, &hits, sizeof hits) != sizeof hits) hits = 0;
                close(fd);
            }
            printf("%zu %d %d %llu %llu %llu\n", bytes, code, on, (unsigned long long)it,
                   (unsigned long long)cpu, (unsigned long long)hits);
            fflush(stdout);
        }
        free(work.base);  // the code and its table live until exit
    }
    return 0;
}
