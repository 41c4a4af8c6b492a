/* Work shared by the threads of a parallel region in runs that shrink as it runs out (OpenMP's guided
 * schedule, by hand so that a thread knows its run): each take is what is left over twice the threads,
 * at least one item. A run of a decode's weight rows reads them one after another (streamed from
 * memory; the prefetchers ramp up again at each new run), and the last small runs even out the
 * threads' ends: equal spans, three a thread, left the threads waiting for each other 9% of a Q4_K
 * decode (perf, Zen 4), a thread's last span being a sixth of the work. The quantized products
 * (quant_matmul.c, the quantized experts) and the fp32 one-row product (gemm.c) share their rows so. */
#ifndef MOE_WORK_H
#define MOE_WORK_H

typedef struct {
  int next, total, nt;
} moe__work;
static inline moe__work moe__work_of(int total, int nt) { return (moe__work){0, total, nt < 1 ? 1 : nt}; }
/* The next run [*first, *first + n) of w's items to the calling thread, n returned; 0 when none is left. */
int moe__work_take(moe__work *w, int *first);

#endif
