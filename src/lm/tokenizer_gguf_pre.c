/* llama.cpp's pre-tokenizer names (tokenizer.ggml.pre, as its converter and llama-vocab.cpp know them)
 * for the byte-level vocabularies libmoe's models use, each with the pre-tokenizer of its models'
 * tokenizer.json: the Split regexes (Isolated, in turn) before ByteLevel, or ByteLevel's own GPT-2
 * regex when there are none. */
#include <cjson/cJSON.h>
#include <string.h>

#include "internal.h"
#include "lm/tokenizer_gguf.h"

/* Llama 3's; Qwen2's is the same with single digits. */
#define LLAMA3_RE "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT4O_RE                                                                                                   \
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
  "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define DEEPSEEK3_RE                                                                                     \
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|" \
  "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"

static const struct {
  const char *name;
  const char *split[3]; /* none: ByteLevel with GPT-2's regex */
  int nfc;              /* the models' tokenizer.json normalizes to NFC first (Qwen2, Qwen3) */
  int ignore_merges;    /* their BPE takes a pre-token that is a token whole (Llama 3, o200k) */
} PRES[] = {
    {"gpt-2", {NULL}, 0, 0},
    {"olmo", {NULL}, 0, 0},
    {"llama-bpe", {LLAMA3_RE}, 0, 1},
    {"qwen2", {QWEN2_RE}, 1, 0},
    {"deepseek-v3", {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", DEEPSEEK3_RE}, 0, 0},
    {"gpt-4o", {GPT4O_RE}, 0, 1},
};
#define NPRES (sizeof PRES / sizeof *PRES)

static cJSON *byte_level(int use_regex) {
  cJSON *b = cJSON_CreateObject();
  if (b && (!cJSON_AddStringToObject(b, "type", "ByteLevel") || !cJSON_AddFalseToObject(b, "add_prefix_space") ||
            !cJSON_AddFalseToObject(b, "trim_offsets") || !cJSON_AddBoolToObject(b, "use_regex", use_regex)))
    cJSON_Delete(b), b = NULL;
  return b;
}

static cJSON *split(const char *re) {
  cJSON *s = cJSON_CreateObject(), *p = cJSON_CreateObject();
  if (!s || !p || !cJSON_AddItemToObject(s, "pattern", p)) {
    cJSON_Delete(s), cJSON_Delete(p);
    return NULL;
  }
  if (!cJSON_AddStringToObject(s, "type", "Split") || !cJSON_AddStringToObject(p, "Regex", re) ||
      !cJSON_AddStringToObject(s, "behavior", "Isolated") || !cJSON_AddFalseToObject(s, "invert"))
    cJSON_Delete(s), s = NULL;
  return s;
}

moe_status moe__tok_gguf_pre(const char *file, const char *pre, cJSON **pre_tokenizer, cJSON **normalizer,
                             int *ignore_merges) {
  *pre_tokenizer = *normalizer = NULL;
  size_t i = 0;
  while (i < NPRES && strcmp(PRES[i].name, pre)) i++;
  MOE_TRY(i < NPRES, MOE_ERR_FORMAT, "%s: tokenizer.ggml.pre \"%s\" is not a pre-tokenizer libmoe knows (gpt-2, olmo, "
          "llama-bpe, qwen2, deepseek-v3, gpt-4o)", file, pre);
  *ignore_merges = PRES[i].ignore_merges;
  int ok = 1;
  if (!PRES[i].split[0]) {
    ok = (*pre_tokenizer = byte_level(1)) != NULL;
  } else {
    cJSON *seq = *pre_tokenizer = cJSON_CreateObject(), *list = cJSON_CreateArray();
    ok = seq && list && cJSON_AddItemToObject(seq, "pretokenizers", list) && cJSON_AddStringToObject(seq, "type", "Sequence");
    if (!ok) cJSON_Delete(list);
    for (int k = 0; ok && k < 3 && PRES[i].split[k]; k++) {
      cJSON *s = split(PRES[i].split[k]);
      ok = s && cJSON_AddItemToArray(list, s);
      if (!ok) cJSON_Delete(s);
    }
    cJSON *b = ok ? byte_level(0) : NULL;
    ok = b && cJSON_AddItemToArray(list, b);
    if (!ok) cJSON_Delete(b);
  }
  if (ok && PRES[i].nfc) {
    *normalizer = cJSON_CreateObject();
    ok = *normalizer && cJSON_AddStringToObject(*normalizer, "type", "NFC");
  }
  if (ok) return MOE_OK;
  cJSON_Delete(*pre_tokenizer), cJSON_Delete(*normalizer);
  *pre_tokenizer = *normalizer = NULL;
  return moe__error(MOE_ERR_NOMEM, __FILE__, __LINE__, "%s: out of memory", file);
}

/* The Split regexes of a pre_tokenizer (a Split, or a Sequence of Splits ending in ByteLevel) into
 * re (room for 3), their count; -1 when it is not of that form. *gpt2: a lone ByteLevel with its regex. */
static int splits_of(const cJSON *p, const char **re, int *gpt2) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
  *gpt2 = 0;
  if (!cJSON_IsString(type)) return -1;
  if (!strcmp(type->valuestring, "ByteLevel")) {
    *gpt2 = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(p, "use_regex"));
    return *gpt2 ? 0 : -1;
  }
  if (strcmp(type->valuestring, "Sequence")) return -1;
  const cJSON *it;
  int n = 0, bl = 0;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(it, "pattern"), "Regex");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(it, "behavior");
    if (!cJSON_IsString(t) || bl) return -1;
    if (!strcmp(t->valuestring, "ByteLevel")) {
      if (!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(it, "use_regex"))) return -1;
      bl = 1;
      continue;
    }
    if (strcmp(t->valuestring, "Split") || !cJSON_IsString(r) || !cJSON_IsString(b) || strcmp(b->valuestring, "Isolated") ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "invert")) || n == 3)
      return -1;
    re[n++] = r->valuestring;
  }
  return bl ? n : -1;
}

const char *moe__tok_gguf_pre_name(const cJSON *pre_tokenizer) {
  const char *re[3];
  int gpt2, n = splits_of(pre_tokenizer, re, &gpt2);
  if (n == 0 && !gpt2) return NULL; /* ByteLevel without a regex: no split at all */
  for (size_t i = 0; n >= 0 && i < NPRES; i++) {
    int k = 0;
    while (k < n && PRES[i].split[k] && !strcmp(PRES[i].split[k], re[k])) k++;
    if (k == n && (k == 3 || !PRES[i].split[k])) return PRES[i].name;
  }
  return NULL;
}
