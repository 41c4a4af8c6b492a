/* Values given by name (options, config fields, flags): the index of a name among the choices. */
#include <string.h>

#include "internal.h"

moe_status moe__parse_name(const char *s, const char *field, const char *const *names, int n, int *out) {
  MOE_TRY(s, MOE_ERR_ARG, "%s: missing value", field);
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) {
      *out = i;
      return MOE_OK;
    }
  char list[128] = "";
  for (int i = 0; i < n; i++) {
    strcat(list, names[i]);
    if (i + 1 < n) strcat(list, "|");
  }
  return moe__error(MOE_ERR_ARG, __FILE__, __LINE__, "%s: unknown value '%s' (want %s)", field, s, list);
}
