/* The Python package (python/libmoe) against this build: runs its unittest suite (python/tests) with
 * Debian's /usr/bin/python3, MOE_LIBRARY set to the libmoe.so next to the moe binary, and MOE_ABI set
 * to sizeof of every struct the package mirrors with ctypes, as this compiler lays out moe.h. SKIP
 * without numpy or torch, and in the sanitizer build (python would need libasan preloaded). */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#define PYTHON "/usr/bin/python3"

/* "name=size ..." of the structs in python/libmoe/_structs.py (MIRRORS). */
static void abi_sizes(char *buf, size_t n) {
#define SIZE_(t) #t "=%zu "
  snprintf(buf, n,
           SIZE_(moe_layer_config) SIZE_(moe_param_info) SIZE_(moe_layer_t) SIZE_(moe_layer_stats)
           SIZE_(moe_layer_overrides) SIZE_(moe_model_config) SIZE_(moe_tensor_ref) SIZE_(moe_model_t)
           SIZE_(moe_model_stats) SIZE_(moe_optim_config) SIZE_(moe_optim_t) SIZE_(moe_train_state)
           SIZE_(moe_dataset) SIZE_(moe_lm_config) SIZE_(moe_lm_t) SIZE_(moe_engine_config) SIZE_(moe_engine_params)
           SIZE_(moe_engine_state) SIZE_(moe_engine_stats) SIZE_(moe_train_batch_stats) SIZE_(moe_train_model)
           SIZE_(moe_cache_switch) SIZE_(moe_train_adjust) SIZE_(moe_trainer_config) SIZE_(moe_train_step)
           SIZE_(moe_trainer_info) SIZE_(moe_augment) SIZE_(moe_lm_stream_config) SIZE_(moe_lm_experts)
           SIZE_(moe_expert_cache_stats) SIZE_(moe_trace),
           sizeof(moe_layer_config), sizeof(moe_param_info), sizeof(moe_layer_t), sizeof(moe_layer_stats),
           sizeof(moe_layer_overrides), sizeof(moe_model_config), sizeof(moe_tensor_ref), sizeof(moe_model_t),
           sizeof(moe_model_stats), sizeof(moe_optim_config), sizeof(moe_optim_t), sizeof(moe_train_state),
           sizeof(moe_dataset), sizeof(moe_lm_config), sizeof(moe_lm_t), sizeof(moe_engine_config),
           sizeof(moe_engine_params), sizeof(moe_engine_state), sizeof(moe_engine_stats),
           sizeof(moe_train_batch_stats), sizeof(moe_train_model), sizeof(moe_cache_switch), sizeof(moe_train_adjust),
           sizeof(moe_trainer_config), sizeof(moe_train_step), sizeof(moe_trainer_info), sizeof(moe_augment),
           sizeof(moe_lm_stream_config), sizeof(moe_lm_experts), sizeof(moe_expert_cache_stats), sizeof(moe_trace));
#undef SIZE_
}

static int sh(const char *cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

TEST(python_package_suite) {
#if defined(__SANITIZE_ADDRESS__)
  SKIP("sanitizer build (python would need libasan preloaded); `make test` runs it");
#endif
  if (sh(PYTHON " -c 'import numpy, torch' >/dev/null 2>&1") != 0) {
    SKIP(PYTHON " lacks numpy or torch (apt-get install python3-numpy python3-torch)");
  }
  /* the repository is two levels above tests/fixtures; the library is in the moe binary's directory */
  char root[1024], lib[1024], abi[2048], out[512], cmd[6144];
  snprintf(root, sizeof root, "%s/../..", MOE_FIXTURE_DIR);
  const char *slash = strrchr(MOE_CLI, '/');
  snprintf(lib, sizeof lib, "%.*slibmoe.so", slash ? (int)(slash - MOE_CLI + 1) : 0, MOE_CLI);
  if (access(lib, R_OK) != 0) FAIL_("%s: no shared library next to the moe binary (build the moe_shared target)", lib);
  abi_sizes(abi, sizeof abi);
  test_tmp_path("python_suite.txt", out, sizeof out);
  /* the BLAS kernels moe runs with (it restarts itself with them), so that runs match it bit for bit
   * however the suite's imports order numpy and libmoe */
  const char *core = moe_blas_better_coretype();
  char blas[64] = "";
  if (core) snprintf(blas, sizeof blas, "OPENBLAS_CORETYPE=%s ", core);
  snprintf(cmd, sizeof cmd,
           "%sMOE_LIBRARY='%s' MOE_CLI='%s' MOE_ABI='%s' PYTHONDONTWRITEBYTECODE=1 " PYTHON
           " -m unittest discover -s '%s/python/tests' >'%s' 2>&1",
           blas, lib, MOE_CLI, abi, root, out);
  int rc = sh(cmd);
  char *text = test_read_file(out, NULL);
  /* every test ran: none may skip here (the ABI check skips only without MOE_ABI) */
  int ok = rc == 0 && text && strstr(text, "\nOK\n");
  if (!ok) {
    fprintf(stderr, "  %s\n  exit %d, output:\n%s\n", cmd, rc, text ? text : "(none)");
    free(text);
    FAIL_("the Python suite failed or skipped tests");
  }
  free(text);
}
