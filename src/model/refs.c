/* The named parameter tables that both models expose (moe_model_t, moe_lm_t): lookup by name. */
#include <string.h>

#include "internal.h"

const moe_tensor_ref *moe__ref_find(const moe_tensor_ref *refs, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(refs[i].name, name)) return &refs[i];
  return NULL;
}
