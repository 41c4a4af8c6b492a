/* The renderer with its bounds chosen by the caller (the fuzz target's are tighter). */
#ifndef MOE_CHAT_RENDER_H
#define MOE_CHAT_RENDER_H

#include "chat/chat.h"

struct cJSON;
/* Renders tmpl[0..n) over the variables of `context` (a cJSON object, or NULL); lim NULL: the
 * defaults of moe_chat_template_render. */
moe_status moe__chat_render(const char *tmpl, size_t n, const struct cJSON *context, int64_t now, const cj_limits *lim,
                            char **out, size_t *len);

#endif
