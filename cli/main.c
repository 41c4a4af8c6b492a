/* The moe command: dispatches to one subcommand per file. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe <command> [options]\n"
          "  train       train an MoE classifier (MNIST by default), with checkpoints and traces\n"
          "  eval        test accuracy of a checkpoint\n"
          "  layer-run   run one MoE layer from safetensors files (forward, and backward with --backward)\n"
          "  bench       the standard layer benchmarks against the sgemm roofline (DESIGN 4.3)\n"
          "  compare     compare the tensors of two safetensors files (OUT against REF)\n"
          "  infer       batch inference of a checkpoint; --cache K keeps only K experts per block in memory\n"
          "  trace       record a checkpoint's expert activations over a data set (DESIGN 4.4)\n"
          "  cachesim    expert-cache miss rates of a trace per layer (lifo, lru, fifo, belady)\n"
          "  placement   place experts on devices from a trace (greedy, anticorr) and compare Max Load\n"
          "  generate    sample tokens from a Hugging Face checkpoint or GGUF file (Mixtral, Qwen2/3-MoE, OLMoE);\n"
          "              --memory-budget SIZE streams the experts from the checkpoint (also eval, serve)\n"          "  chat        a conversation in the terminal through a checkpoint's chat template\n"
          "  serve       an HTTP server (OpenAI completions) for such a checkpoint, with continuous batching\n"
          "  plot-trace  the expert-load heatmap of a trace (step x expert, one panel per layer) as PNG or SVG\n"
          "  tokenizer   train a byte-level BPE tokenizer (Hugging Face tokenizer.json); encode, decode\n"
          "  simulate    one training step of an MoE layer on a simulated cluster: time, memory, policies\n"
          "  gguf        gguf info FILE: a GGUF file's metadata and tensor table\n"
          "  convert     a language model from a Hugging Face directory to a GGUF file (llama.cpp's), and back\n"
          "  quantize    a GGUF file's weights to Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4, F16, BF16 or F32\n"
          "  --version   print the version, the BLAS in use, the CPU and the kernels chosen for it\n");
}

/* argv with every "--flag=value" as the two arguments "--flag" "value", so that each subcommand's
 * parser takes both spellings; NULL when out of memory. The strings point into argv's (the flag's
 * copy excepted), which live as long as the process. */
static char **split_flag_values(int argc, char **argv, int *out_argc) {
  char **v = malloc(sizeof(char *) * (2 * (size_t)argc + 1));
  int n = 0;
  for (int i = 0; v && i < argc; i++) {
    char *eq = i > 1 && !strncmp(argv[i], "--", 2) ? strchr(argv[i], '=') : NULL;
    if (!eq) {
      v[n++] = argv[i];
      continue;
    }
    v[n] = strndup(argv[i], (size_t)(eq - argv[i]));
    if (!v[n]) return NULL;
    v[++n] = eq + 1;
    n++;
  }
  if (v) v[n] = NULL;
  *out_argc = n;
  return v;
}

int main(int argc, char **argv) {
  /* Faster BLAS kernels than the ones OpenBLAS picked, when the CPU has them: they are chosen at
   * load time, so set the core type and start again (once: the variable is then set). */
  const char *core = moe_blas_better_coretype();
  if (core && setenv("OPENBLAS_CORETYPE", core, 1) == 0 && setenv("MOE_BLAS_REEXEC", "1", 1) == 0)
    execv("/proc/self/exe", argv);
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("moe %s, %s\n%s\n", MOE_VERSION, moe_blas_info(), moe_cpu_info());
    return 0;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  static char **volatile args; /* for the process's life, and reachable for LeakSanitizer (volatile: a store the
                                * optimizer may not drop, though nothing reads it) */
  argv = args = split_flag_values(argc, argv, &argc);
  if (!argv) {
    fprintf(stderr, "moe: out of memory\n");
    return 1;
  }
  if (!strcmp(argv[1], "layer-run")) return cmd_layer_run(argc - 1, argv + 1);
  if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
  if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(argv[1], "compare")) return cmd_compare(argc - 1, argv + 1);
  if (!strcmp(argv[1], "cachesim")) return cmd_cachesim(argc - 1, argv + 1);
  if (!strcmp(argv[1], "placement")) return cmd_placement(argc - 1, argv + 1);
  if (!strcmp(argv[1], "plot-trace")) return cmd_plot_trace(argc - 1, argv + 1);
  if (!strcmp(argv[1], "infer")) return cmd_infer(argc - 1, argv + 1);
  if (!strcmp(argv[1], "trace")) return cmd_trace(argc - 1, argv + 1);
  if (!strcmp(argv[1], "tokenizer")) return cmd_tokenizer(argc - 1, argv + 1);
  if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
  if (!strcmp(argv[1], "chat")) return cmd_chat(argc - 1, argv + 1);
  if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 1, argv + 1);
  if (!strcmp(argv[1], "simulate")) return cmd_simulate(argc - 1, argv + 1);
  if (!strcmp(argv[1], "gguf")) return cmd_gguf(argc - 1, argv + 1);
  if (!strcmp(argv[1], "quantize")) return cmd_quantize(argc - 1, argv + 1);
  if (!strcmp(argv[1], "convert")) return cmd_convert(argc - 1, argv + 1);
  fprintf(stderr, "moe: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 1;
}
