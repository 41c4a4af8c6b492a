/* The simulator (moe simulate, DESIGN 4.6) on hand-computable cases: one node without overlap is
 * compute plus alpha-beta exactly; Linear and 2DH message counts and times over two levels; pipelining
 * matches the analytic overlap of the S1 S2 R1 S3 R2 ... order; memory is pipe_model.h's formula; the
 * policies' choices move the way the papers say. */
#include <stdlib.h>

#include "sim/sim.h"
#include "test.h"

/* D 8, H 16, 4-byte elements, uniform routing, top-1, no capacity, n = 1, Linear, no reuse, r = 1. */
static moe_sim_config base(int nodes, int dpn, int T, int E) {
  return (moe_sim_config){.nodes = nodes, .dpn = dpn, .intra_bw = 1e9, .intra_lat = 1e-5, .inter_bw = 1e8,
                          .inter_lat = 1e-4, .gemm_flops = 1e9, .T = T, .D = 8, .H = 16, .E = E, .k = 1,
                          .elem = 4, .pipeline = 1, .r = 1};
}

/* 2 devices, 2 experts, 1000 tokens each, half to the other device: 500 tokens x 8 x 4 bytes one way;
 * each device computes 1000 rows: 4 D H FLOPs forward, 8 D H backward per row. Without overlap the
 * step is 4 all-to-alls + forward + backward. */
TEST(simulate_one_node_no_overlap) {
  moe_sim_config c = base(1, 2, 1000, 2);
  moe_sim_result r;
  ASSERT_OK(moe_sim_run(&c, &r));
  double a = 1e-5 + 500.0 * 8 * 4 / 1e9, comp = 12.0 * 8 * 16 * 1000 / 1e9;
  ASSERT_NEAR(r.step_s, 4 * a + comp, 1e-15);
  ASSERT_NEAR(r.compute_s, comp, 1e-15);
  ASSERT_NEAR(r.exposed_comm_s, 4 * a, 1e-15);
  ASSERT_NEAR(r.comm_s, 4 * a, 1e-15);
  ASSERT_EQ_INT(r.a2a_msgs, 1);
  ASSERT_EQ_INT(r.n, 1);
}

/* The passes around the experts' GEMMs and the GEMM kinds, by hand on one device, 100 tokens to 2
 * experts (2 GEMMs of each kind, 100 rows): forward 2 NT GEMMs of 2 D H (100 + 2 n_1/2) FLOPs,
 * backward 2 NN and 2 TN; the router's 3 GEMMs of 2 T E D FLOPs at the NT rate; at mem_bw the
 * expert side's elements (forward 4 rows H + 2 rows D, backward 4 rows H + rows D) and the token
 * side's (T D 2 + 1 + 0 + 4, a D 2 + 1 + 3 + 1, T E (6 + k) + 6), 4 bytes each. */
TEST(simulate_passes_and_gemm_kinds) {
  moe_sim_config c = base(1, 1, 100, 2);
  c.nt = (moe__sim_gemm){1e9, 10}, c.gemm_flops = 2e9, c.tn = (moe__sim_gemm){4e9, 20}, c.mem_bw = 1e8;
  moe_sim_result r;
  ASSERT_OK(moe_sim_run(&c, &r));
  double DH2 = 2.0 * 8 * 16, gemms = 2 * DH2 * 120 / 1e9 + 2 * DH2 * 100 / 2e9 + 2 * DH2 * 140 / 4e9;
  double router = 3 * 2.0 * 100 * 2 * 8 / 1e9;
  double expert = (4 * 100 * 16 + 2 * 100 * 8 + 4 * 100 * 16 + 100 * 8) * 4 / 1e8;
  double token = (7 * 800.0 + 7 * 800 + 13 * 200) * 4 / 1e8;
  ASSERT_NEAR(r.step_s, gemms + router + expert + token, 1e-15);
  ASSERT_NEAR(r.step_s, 1.27456e-3, 1e-15);
  ASSERT_NEAR(r.compute_s, r.step_s, 1e-15);
  c.mem_bw = 0; /* the passes and the router left out: the GEMMs alone */
  ASSERT_OK(moe_sim_run(&c, &r));
  ASSERT_NEAR(r.step_s, gemms, 1e-15);
}

/* 4 nodes x 4 devices, b bytes between every pair. Linear: 3 intra-node messages of b on the device's
 * link, concurrently 12 inter-node messages per device with the node's 4 x 12 b over its NIC. 2DH: 3
 * intra-node messages carrying the 12 b that change local index, then 3 inter-node messages, the NIC
 * again carrying 48 b. 2DH wins on small messages (latency), Linear on large ones (one phase). */
TEST(simulate_a2a_linear_vs_2dh) {
  moe_sim_config c = base(4, 4, 1, 16);
  ASSERT_EQ_INT(moe__sim_msgs(&c, MOE__A2A_LINEAR), 15);
  ASSERT_EQ_INT(moe__sim_msgs(&c, MOE__A2A_2DH), 6);
  double bytes[256];
  for (double b = 1e2; b <= 1e6; b *= 1e4) {
    for (int i = 0; i < 256; i++) bytes[i] = i / 16 == i % 16 ? 0 : b;
    double lin = fmax(3 * 1e-5 + 3 * b / 1e9, 12 * 1e-4 + 48 * b / 1e8);
    double dh = 3 * 1e-5 + 12 * b / 1e9 + 3 * 1e-4 + 48 * b / 1e8;
    ASSERT_NEAR(moe__sim_a2a(&c, MOE__A2A_LINEAR, bytes), lin, 1e-12);
    ASSERT_NEAR(moe__sim_a2a(&c, MOE__A2A_2DH, bytes), dh, 1e-12);
    if (b < 1e4) ASSERT(dh < lin);
    else ASSERT(lin < dh);
  }
}

/* n = 4 micro-batches on a uniform load, latency 0: a = one micro-batch's all-to-all, c its forward
 * compute (2c backward). Order S1 S2 R1 S3 R2 ...: with c >= 2a a pass is 2a + n c (compute bound),
 * with c <= a it is 2 n a (the communication stream never idles). */
TEST(simulate_pipeline_overlap) {
  moe_sim_config c = base(1, 2, 1000, 2);
  c.intra_lat = 0, c.pipeline = 4, c.gemm_flops = 1.28e8;
  double cf = 4.0 * 8 * 16 * 250 / c.gemm_flops; /* 250 rows per micro-batch: 1 ms */
  double bytes = 125.0 * 8 * 4;                  /* 125 tokens each way */
  moe_sim_result r;
  c.intra_bw = bytes / 0.5e-3; /* a = 0.5 ms: compute bound in both passes */
  ASSERT_OK(moe_sim_run(&c, &r));
  double a = bytes / c.intra_bw;
  ASSERT_NEAR(r.step_s, (2 * a + 4 * cf) + (2 * a + 4 * 2 * cf), 1e-12);
  c.intra_bw = bytes / 4e-3; /* a = 4 ms >= 2c: communication bound */
  ASSERT_OK(moe_sim_run(&c, &r));
  a = bytes / c.intra_bw;
  ASSERT_NEAR(r.step_s, 2 * (2 * 4 * a), 1e-12);
  ASSERT_NEAR(r.compute_s, 12 * cf, 1e-12);
}

/* Peak memory: Eq. 1's states of the device's experts and the gate, and the pools of its received rows:
 * without reuse B rows in each of T_DI, T_M, T_DO; S4 with n = 4 keeps 2, 1 and 2 buffers of B/4. */
TEST(simulate_memory_formula) {
  moe_sim_config c = base(1, 2, 1000, 4);
  moe_sim_result r;
  ASSERT_OK(moe_sim_run(&c, &r));
  double states = 4.0 * (4 * 8 + 2 * (2.0 * 16 * 8)) * 4, B = 1000;
  ASSERT_NEAR(r.peak_bytes, states + (B * 8 + B * 16 + B * 8) * 4, 1e-6);
  c.reuse = MOE__REUSE_S4, c.pipeline = 4;
  ASSERT_OK(moe_sim_run(&c, &r));
  double b = 250;
  ASSERT_NEAR(r.peak_bytes, states + (2 * b * 8 + b * 16 + 2 * b * 8) * 4, 1e-6);
  c.mem_bytes = r.peak_bytes - 1;
  ASSERT_OK(moe_sim_run(&c, &r));
  ASSERT_EQ_INT(r.fits, 0);
}

/* MPipeMoE's claim (P4 Fig. 12): the best n grows with the batch. Cost profile: 8 devices on one node,
 * 50 GB/s and 20 us per message, 100 TFLOP/s, D 1024, H 4096, fp32: each micro-batch pays 7 message
 * latencies per all-to-all, so n doubles each time the batch grows 4x. */
TEST(simulate_auto_n_grows_with_batch) {
  moe_sim_config c = base(1, 8, 0, 8);
  c.intra_bw = 5e10, c.intra_lat = 2e-5, c.gemm_flops = 1e14, c.D = 1024, c.H = 4096, c.pipeline = 0;
  const int T[] = {2048, 8192, 32768}, want[] = {2, 4, 8};
  for (int i = 0; i < 3; i++) {
    c.T = T[i];
    moe_sim_result r;
    ASSERT_OK(moe_sim_run(&c, &r));
    if (r.n != want[i] || !r.auto_n) FAIL_("T %d: Algorithm 1 chose n = %d, want %d", T[i], r.n, want[i]);
  }
}

/* Zipf-skewed routing: the device holding the hot experts computes longest and the step waits for it;
 * FlexMoE's policy maker replicates the hot experts, lowering Eq. 6's ratio and the simulated step. */
TEST(simulate_skew_straggler_flex) {
  moe_sim_config c = base(1, 8, 4096, 16);
  c.D = 256, c.H = 1024, c.intra_bw = 1e11, c.gemm_flops = 1e12;
  moe_sim_result u, s;
  ASSERT_OK(moe_sim_run(&c, &u));
  c.zipf = 1.2;
  ASSERT_OK(moe_sim_run(&c, &s));
  ASSERT_EQ_INT(s.slowest, 0);
  if (!(s.compute_s > 2 * u.compute_s && s.step_s > 1.5 * u.step_s))
    FAIL_("skew: compute %g vs uniform %g, step %g vs %g", s.compute_s, u.compute_s, s.step_s, u.step_s);
  ASSERT_NEAR(u.compute_s, u.compute_min_s, 1e-15);
  c.flex = 1;
  ASSERT_OK(moe_sim_run(&c, &s));
  ASSERT(s.flex && s.flex_ops > 0);
  if (!(s.balance_after < s.balance_before && s.step_s < s.step_before_s))
    FAIL_("flex: balance %g -> %g, step %g -> %g", s.balance_before, s.balance_after, s.step_before_s, s.step_s);
}

/* Capacity: a factor of 1 cuts every expert to ceil(T k / E) tokens per device. */
TEST(simulate_route_capacity) {
  moe_sim_config c = base(1, 2, 100, 4);
  c.zipf = 1, c.k = 2;
  int64_t n[4];
  ASSERT_OK(moe__sim_route(&c, n));
  ASSERT_EQ_INT(n[0] + n[1] + n[2] + n[3], 200);
  ASSERT(n[0] > n[1] && n[1] > n[2] && n[2] > n[3]);
  c.cf = 1;
  ASSERT_OK(moe__sim_route(&c, n));
  ASSERT_EQ_INT(n[0], 50);
  ASSERT(n[3] < 50);
}

/* The policies' choices at the two ends: Tutel's dictionary takes 2DH on 16 nodes with small messages
 * (latency bound) and Linear on 2 nodes with large ones; Eq. 10 takes S4 without a host link (the only
 * memory-saving strategy left) and an offloading one when the host link is fast. */
TEST(simulate_policy_choices) {
  moe_sim_config c = base(16, 4, 64, 64);
  c.intra_bw = 1e11, c.intra_lat = 5e-6, c.inter_bw = 1e11, c.inter_lat = 2e-5, c.gemm_flops = 1e14;
  c.D = 1024, c.H = 1024;
  moe_sim_result r;
  ASSERT_OK(moe_sim_run(&c, &r));
  if (strcmp(r.tutel_a2a, "2dh") || strcmp(r.eq10_reuse, "s4"))
    FAIL_("16 nodes, 64 tokens: dictionary %s, Eq. 10 %s; want 2dh, s4", r.tutel_a2a, r.eq10_reuse);
  c.nodes = 2, c.T = 65536, c.host_bw = 1e12;
  ASSERT_OK(moe_sim_run(&c, &r));
  if (strcmp(r.tutel_a2a, "linear") || !strcmp(r.eq10_reuse, "s4"))
    FAIL_("2 nodes, 65536 tokens: dictionary %s, Eq. 10 %s; want linear, s2 or s3", r.tutel_a2a, r.eq10_reuse);
  c.flex = 1, c.nodes = 17, c.E = 68;
  ASSERT_STATUS(moe_sim_run(&c, &r), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "at most 64"));
}

/* Tutel's r on 4 devices of one node holding one expert (m = 4), 10 tokens each: r = 2 is two shards
 * of H/2 on devices {0, 1} and {2, 3}, source g using replica g % 2 of each, each shard all-gathered
 * by its 2 replicas (2 x (1 message + half the shard)); r = 0 keeps every token home and all-gathers
 * the expert over the 4; r = 4 splits H four ways with nothing to gather. */
TEST(simulate_parallel_r) {
  moe_sim_config c = base(1, 4, 10, 1);
  int64_t per_expert[1] = {10}, send[16];
  moe_sim_config dev;
  double gather;
  ASSERT_EQ_INT(moe__sim_r_max(&c), 4);
  ASSERT_OK(moe__sim_parallel(&c, per_expert, 2, send, &dev, &gather));
  static const int64_t want2[16] = {10, 0, 10, 0, 0, 10, 0, 10, 10, 0, 10, 0, 0, 10, 0, 10};
  for (int i = 0; i < 16; i++)
    if (send[i] != want2[i]) FAIL_("r 2: send[%d] = %lld, want %lld", i, (long long)send[i], (long long)want2[i]);
  double shard = 2.0 * 8 * 16 * 4 / 2;
  ASSERT_EQ_INT(dev.H, 8);
  ASSERT_NEAR(gather, 2 * (1e-5 + 0.5 * shard / 1e9), 1e-15);
  ASSERT_OK(moe__sim_parallel(&c, per_expert, 0, send, &dev, &gather));
  for (int i = 0; i < 16; i++) ASSERT_EQ_INT((int)send[i], i % 5 == 0 ? 10 : 0);
  ASSERT_NEAR(gather, 2 * (3 * 1e-5 + 0.75 * 2 * shard / 1e9), 1e-15);
  ASSERT_OK(moe__sim_parallel(&c, per_expert, 4, send, &dev, &gather));
  ASSERT_EQ_INT(dev.H, 4);
  ASSERT_NEAR(gather, 0, 0);
  ASSERT_STATUS(moe__sim_parallel(&c, per_expert, 5, send, &dev, &gather), MOE_ERR_ARG);
}

/* The public serving run (moe_sim_serve) on simulate_cli_serving_run's hand-computed case: one layer of
 * 4 experts, 2 LIFO slots, 1 MB/s to the slow memory: hit rate 1/5, 4 misses of 20 accesses' worth;
 * a config without a trace is no serving run. */
TEST(simulate_serve_api) {
  char trace[512], p[512];
  test_tmp_path("sim_api_trace.csv", trace, sizeof trace);
  FILE *f = fopen(trace, "w");
  fputs("step,layer,expert,tokens\n0,0,0,2\n0,0,1,2\n1,0,0,4\n2,0,2,4\n3,0,1,4\n", f);
  fclose(f);
  for (int with = 1; with >= 0; with--) {
    test_tmp_path("sim_api.json", p, sizeof p);
    f = fopen(p, "w");
    fprintf(f, "{\"devices_per_node\": 1, \"intra_bw\": 1e9, \"intra_lat\": 0, \"gemm_flops\": 1e9, \"tokens\": 4,"
               " \"d_model\": 8, \"hidden\": 16, \"experts\": 4");
    if (with) fprintf(f, ", \"serve_trace\": \"%s\", \"cache_experts\": 2, \"fetch_bw\": 1e6", trace);
    fputs("}", f);
    fclose(f);
    moe_sim_config *c;
    ASSERT_OK(moe_sim_config_load(p, &c));
    moe_sim_serve_result r;
    ASSERT_EQ_INT(moe_sim_config_serves(c), with);
    moe_status st = moe_sim_serve(c, &r);
    moe_sim_config_free(c);
    if (!with) {
      ASSERT_EQ_INT(st, MOE_ERR_ARG);
      continue;
    }
    ASSERT_OK(st);
    ASSERT_EQ_INT(r.steps, 4);
    ASSERT_EQ_INT(r.layers, 1);
    ASSERT_EQ_INT(r.tokens, 16);
    ASSERT_EQ_INT(r.misses, 4);
    ASSERT_EQ_INT(r.accesses, 5);
    ASSERT_EQ_INT(r.cache_experts, 2);
    ASSERT(!strcmp(r.cache_policy, "lifo"));
    ASSERT_NEAR(r.hit_rate, 0.2, 1e-12);
    double run = 2 * 1.12e-3 + 1.024e-6 + 2.048e-6 + 2 * (1.12e-3 + 2.048e-6);
    ASSERT_NEAR(r.time_s, run, 1e-15);
    ASSERT_NEAR(r.fetch_s, 4 * 1.12e-3, 1e-15);
  }
}

