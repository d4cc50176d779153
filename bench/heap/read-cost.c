/* What a read of another process's memory costs on this machine, without
 * Python's own overhead: the numbers docs/design/heap.md estimates pytrace
 * heap's walk time from. Built and run by read-rate.py when given the
 * READ_COST=path of its binary (cc -O2 -o /tmp/read-cost read-cost.c).
 *
 *   read-cost PID FILE   (FILE: one arena start address per line, hex)
 *
 * Each arena is 1 MiB of the target. Prints, per way of reading:
 *   pread of /proc/PID/mem, 1 MiB at a time        -> MiB/s
 *   process_vm_readv, one 1 MiB iovec per call     -> MiB/s
 *   pread of 32 bytes at scattered addresses       -> ns per read
 *   process_vm_readv, 1024 iovecs of 32 bytes      -> ns per element
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define ARENA (1 << 20)
#define SMALL 32
#define BATCH 1024

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    pid_t pid = atoi(argv[1]);
    FILE *f = fopen(argv[2], "r");
    uint64_t *arenas = NULL, a;
    size_t n = 0;
    while (f && fscanf(f, "%lx", &a) == 1) {
        arenas = realloc(arenas, (n + 1) * sizeof *arenas);
        arenas[n++] = a;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", pid);
    int mem = open(path, O_RDONLY);
    if (mem < 0 || n == 0) return 1;
    char *buf = malloc(ARENA);
    volatile uint64_t sink = 0;

    double t = now();
    for (size_t i = 0; i < n; i++) {
        if (pread(mem, buf, ARENA, arenas[i]) != ARENA) return 1;
        sink += buf[ARENA - 1];
    }
    double bulk = now() - t;

    t = now();
    for (size_t i = 0; i < n; i++) {
        struct iovec local = {buf, ARENA}, remote = {(void *)arenas[i], ARENA};
        if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != ARENA) return 1;
        sink += buf[0];
    }
    double bulk_vm = now() - t;

    /* Scattered small reads: 97 spots per arena page-crossing stride, the
     * pattern of following pointers through a heap. */
    size_t small = 0;
    t = now();
    for (size_t i = 0; i < n; i++)
        for (uint64_t off = 0; off + SMALL <= ARENA; off += 10816) {
            if (pread(mem, buf, SMALL, arenas[(i * 7919) % n] + off) != SMALL) return 1;
            small++;
        }
    double scattered = now() - t;

    static struct iovec local[BATCH], remote[BATCH];
    size_t batched = 0;
    t = now();
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        for (uint64_t off = 0; off + SMALL <= ARENA && k < BATCH; off += 1016, k++) {
            local[k] = (struct iovec){buf + k * SMALL, SMALL};
            remote[k] = (struct iovec){(void *)(arenas[(i * 7919) % n] + off), SMALL};
        }
        if (process_vm_readv(pid, local, k, remote, k, 0) != (ssize_t)(k * SMALL)) return 1;
        batched += k;
    }
    double batch = now() - t;

    printf("pread 1 MiB: %.0f MiB/s; process_vm_readv 1 MiB: %.0f MiB/s; "
           "pread 32 B scattered: %.0f ns each (%zu reads); process_vm_readv 1024 x 32 B: %.0f ns each (%zu)\n",
           n / bulk, n / bulk_vm, scattered / small * 1e9, small, batch / batched * 1e9, batched);
    return (int)(sink & 0);
}
