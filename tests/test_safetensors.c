/* Tests of the safetensors reader and writer: round trips, atomic saves, and one test per kind of
 * malformed file, each checking the exact status and that the message names the culprit. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

/* Writes an 8-byte little-endian header length (hlen, or strlen(json) when hlen is 0), the JSON
 * text and ndata bytes counting up from 0. Returns 0 on failure. */
static int write_raw(const char *path, const char *json, uint64_t hlen, size_t ndata) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return 0;
  if (!hlen) hlen = strlen(json);
  int ok = 1;
  for (int i = 0; i < 8; i++) ok &= fputc((int)(hlen >> (8 * i) & 0xff), fp) != EOF;
  ok &= fwrite(json, 1, strlen(json), fp) == strlen(json);
  for (size_t i = 0; i < ndata; i++) ok &= fputc((int)(i & 0xff), fp) != EOF;
  return fclose(fp) == 0 && ok;
}

/* Does any entry of the scratch directory start with prefix? */
static int tmp_dir_has(const char *prefix) {
  char dir[512];
  DIR *d = opendir(test_tmp_path("", dir, sizeof dir));
  if (!d) return -1;
  int found = 0;
  for (struct dirent *e; (e = readdir(d));) found |= strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return found;
}

/* Writes a file and expects moe_st_open to fail with status st and a message containing needle. */
#define EXPECT_BAD(tag, json, hlen, ndata, st, needle)                                              \
  do {                                                                                            \
    char p_[512];                                                                                 \
    moe_st *f_ = NULL;                                                                            \
    ASSERT(write_raw(test_tmp_path(tag ".safetensors", p_, sizeof p_), json, hlen, ndata));       \
    moe_status s_ = moe_st_open(&f_, p_);                                                         \
    moe_st_close(f_);                                                                             \
    if (s_ != (st)) FAIL_("open -> %s, want %s (%s)", moe_status_name(s_), moe_status_name(st),   \
                          moe_last_error());                                                      \
    ASSERT(f_ == NULL);                                                                           \
    if (!strstr(moe_last_error(), needle)) FAIL_("error '%s' lacks '%s'", moe_last_error(), needle); \
    if (!strstr(moe_last_error(), tag)) FAIL_("error '%s' lacks the path", moe_last_error());       \
  } while (0)

#define ENTRY(name, dt, shape, b, e) \
  "\"" name "\": {\"dtype\": \"" dt "\", \"shape\": " shape ", \"data_offsets\": [" #b ", " #e "]}"

TEST(st_dtype_names_and_sizes) {
  ASSERT(!strcmp(moe_dtype_name(MOE_DT_F32), "F32"));
  ASSERT(!strcmp(moe_dtype_name(MOE_DT_BF16), "BF16"));
  ASSERT(!strcmp(moe_dtype_name(MOE_DT_U8), "U8"));
  ASSERT_EQ_INT(moe_dtype_size(MOE_DT_F32), 4);
  ASSERT_EQ_INT(moe_dtype_size(MOE_DT_F16), 2);
  ASSERT_EQ_INT(moe_dtype_size(MOE_DT_I64), 8);
  ASSERT_EQ_INT(moe_dtype_size(MOE_DT_U8), 1);
  ASSERT_EQ_INT(moe_dtype_size(MOE_DT_COUNT), 0);
}

TEST(st_round_trip) {
  char p[512];
  test_tmp_path("rt.safetensors", p, sizeof p);
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  float a[6] = {1.5f, -2.f, 3.25f, 0.f, 1e-7f, -1e30f};
  int32_t b[4] = {7, -8, 2147483647, -2147483647 - 1};
  float s = 3.5f;
  int64_t sa[2] = {2, 3}, sb[1] = {4}, sz[2] = {0, 5};
  moe_status st = MOE_OK;
  if (!st) st = moe_st_writer_add(w, "layer.a", MOE_DT_F32, 2, sa, a);
  if (!st) st = moe_st_writer_add(w, "b", MOE_DT_I32, 1, sb, b);
  if (!st) st = moe_st_writer_add(w, "empty", MOE_DT_F32, 2, sz, NULL);
  if (!st) st = moe_st_writer_add(w, "scalar", MOE_DT_F32, 0, NULL, &s);
  if (!st) st = moe_st_writer_meta(w, "top_k", "2");
  if (!st) st = moe_st_writer_meta(w, "activation", "relu");
  if (!st) st = moe_st_writer_meta(w, "top_k", "1"); /* replaces */
  if (!st) st = moe_st_writer_save(w, p);
  moe_st_writer_free(w);
  ASSERT_OK(st);

  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  moe_tensor_view va, vb, ve, vs, v0;
  int ok = moe_st_count(f) == 4 && !strcmp(moe_st_path(f), p) && moe_st_get(f, "layer.a", &va) == MOE_OK &&
           moe_st_get(f, "b", &vb) == MOE_OK && moe_st_get(f, "empty", &ve) == MOE_OK &&
           moe_st_get(f, "scalar", &vs) == MOE_OK && moe_st_at(f, 0, &v0) == MOE_OK;
  const char *k = moe_st_meta(f, "top_k"), *act = moe_st_meta(f, "activation"), *none = moe_st_meta(f, "x");
  int has = moe_st_has(f, "b"), hasnt = moe_st_has(f, "c");
  /* Copy what we check, then close, so failures below do not leak. */
  float ra[6], rs;
  int32_t rb[4];
  if (ok) memcpy(ra, va.data, sizeof ra), memcpy(rb, vb.data, sizeof rb), memcpy(&rs, vs.data, 4);
  int kv = k && !strcmp(k, "1") && act && !strcmp(act, "relu") && !none;
  int first_is_a = ok && !strcmp(v0.name, "layer.a"); /* offset 0: the first one added among 4-byte dtypes */
  int aligned = ok && (uintptr_t)va.data % 4 == 0 && (uintptr_t)vb.data % 4 == 0;
  moe_st_close(f);
  ASSERT(ok);
  ASSERT(kv);
  ASSERT(has && !hasnt);
  ASSERT(first_is_a && aligned);
  ASSERT_EQ_INT(va.dtype, MOE_DT_F32);
  ASSERT_EQ_INT(va.ndim, 2);
  ASSERT_EQ_INT(va.shape[0], 2);
  ASSERT_EQ_INT(va.shape[1], 3);
  ASSERT_EQ_INT(va.nbytes, 24);
  for (int i = 0; i < 6; i++) ASSERT(ra[i] == a[i]);
  ASSERT_EQ_INT(vb.dtype, MOE_DT_I32);
  ASSERT_EQ_INT(vb.ndim, 1);
  ASSERT_EQ_INT(vb.shape[0], 4);
  for (int i = 0; i < 4; i++) ASSERT_EQ_INT(rb[i], b[i]);
  ASSERT_EQ_INT(ve.ndim, 2);
  ASSERT_EQ_INT(ve.shape[0], 0);
  ASSERT_EQ_INT(ve.shape[1], 5);
  ASSERT_EQ_INT(ve.nbytes, 0);
  ASSERT_EQ_INT(vs.ndim, 0);
  ASSERT_EQ_INT(vs.nbytes, 4);
  ASSERT(rs == 3.5f);
}

TEST(st_round_trip_mixed_dtypes_are_aligned) {
  char p[512];
  test_tmp_path("mixed.safetensors", p, sizeof p);
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  uint8_t u[3] = {1, 2, 255};
  double d[2] = {0.1, -2.5};
  uint16_t h[1] = {0x3f80};
  int64_t l[1] = {-(INT64_C(1) << 40)};
  int64_t s3[1] = {3}, s2[1] = {2}, s1[1] = {1};
  moe_status st = MOE_OK;
  /* U8 first: insertion-order layout would misalign everything after it. */
  if (!st) st = moe_st_writer_add(w, "u", MOE_DT_U8, 1, s3, u);
  if (!st) st = moe_st_writer_add(w, "h", MOE_DT_BF16, 1, s1, h);
  if (!st) st = moe_st_writer_add(w, "d", MOE_DT_F64, 1, s2, d);
  if (!st) st = moe_st_writer_add(w, "l", MOE_DT_I64, 1, s1, l);
  if (!st) st = moe_st_writer_save(w, p);
  moe_st_writer_free(w);
  ASSERT_OK(st);
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  moe_tensor_view v[4];
  int ok = moe_st_count(f) == 4, aligned = 1;
  for (int i = 0; ok && i < 4; i++) {
    ok = moe_st_at(f, i, &v[i]) == MOE_OK;
    aligned &= (uintptr_t)v[i].data % moe_dtype_size(v[i].dtype) == 0;
  }
  uint8_t ru[3] = {0};
  double rd[2] = {0};
  uint16_t rh = 0;
  int64_t rl = 0;
  moe_tensor_view t;
  if (ok && moe_st_get(f, "u", &t) == MOE_OK) memcpy(ru, t.data, 3);
  if (ok && moe_st_get(f, "d", &t) == MOE_OK) memcpy(rd, t.data, 16);
  if (ok && moe_st_get(f, "h", &t) == MOE_OK) memcpy(&rh, t.data, 2);
  if (ok && moe_st_get(f, "l", &t) == MOE_OK) memcpy(&rl, t.data, 8);
  /* moe_st_at goes by data offset: 8-byte dtypes first (in insertion order), then 2, then 1. */
  int order = ok && !strcmp(v[0].name, "d") && !strcmp(v[1].name, "l") && !strcmp(v[2].name, "h") &&
              !strcmp(v[3].name, "u");
  moe_st_close(f);
  ASSERT(ok && aligned && order);
  ASSERT(ru[0] == 1 && ru[1] == 2 && ru[2] == 255);
  ASSERT(rd[0] == 0.1 && rd[1] == -2.5);
  ASSERT_EQ_INT(rh, 0x3f80);
  ASSERT_EQ_INT(rl, -(INT64_C(1) << 40));
}

TEST(st_empty_writer_round_trip) {
  char p[512];
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  moe_status st = moe_st_writer_save(w, test_tmp_path("none.safetensors", p, sizeof p));
  moe_st_writer_free(w);
  ASSERT_OK(st);
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  int n = moe_st_count(f);
  const char *m = moe_st_meta(f, "a");
  moe_st_close(f);
  ASSERT_EQ_INT(n, 0);
  ASSERT(m == NULL);
}

TEST(st_atomic_overwrite_leaves_no_temp) {
  char p[512];
  test_tmp_path("atomic.safetensors", p, sizeof p);
  for (int round = 0; round < 2; round++) {
    moe_st_writer *w = NULL;
    ASSERT_OK(moe_st_writer_new(&w));
    int32_t x[3] = {round, round + 10, round + 20};
    int64_t n = round ? 3 : 2;
    moe_status st = moe_st_writer_add(w, round ? "second" : "first", MOE_DT_I32, 1, &n, x);
    if (!st) st = moe_st_writer_save(w, p);
    moe_st_writer_free(w);
    ASSERT_OK(st);
  }
  ASSERT_EQ_INT(tmp_dir_has("atomic.safetensors.tmp"), 0);
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  moe_tensor_view v;
  int has_first = moe_st_has(f, "first"), n = moe_st_count(f);
  moe_status st = moe_st_get(f, "second", &v);
  int32_t r[3] = {0};
  if (!st) memcpy(r, v.data, sizeof r);
  moe_st_close(f);
  ASSERT_OK(st);
  ASSERT_EQ_INT(n, 1);
  ASSERT(!has_first);
  ASSERT_EQ_INT(v.shape[0], 3);
  ASSERT(r[0] == 1 && r[1] == 11 && r[2] == 21);
}

TEST(st_save_failure_is_clean) {
  char dir[512], p[512];
  test_tmp_path("adir", dir, sizeof dir);
  ASSERT(mkdir(dir, 0755) == 0);
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  int64_t n = 1;
  float x = 1;
  moe_status s1 = moe_st_writer_add(w, "x", MOE_DT_F32, 1, &n, &x);
  moe_status s2 = moe_st_writer_save(w, dir); /* rename onto a directory fails */
  char e2[1024];
  snprintf(e2, sizeof e2, "%s", moe_last_error());
  test_tmp_path("adir/no/such/dir/x.safetensors", p, sizeof p);
  moe_status s3 = moe_st_writer_save(w, p);
  moe_st_writer_free(w);
  ASSERT_OK(s1);
  ASSERT_EQ_INT(s2, MOE_ERR_IO);
  ASSERT(strstr(e2, dir) != NULL);
  ASSERT(strstr(e2, "directory") != NULL); /* strerror(EISDIR) */
  ASSERT_STATUS(s3, MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "x.safetensors") != NULL);
  ASSERT(strstr(moe_last_error(), "No such file") != NULL);
  ASSERT_EQ_INT(tmp_dir_has("adir.tmp"), 0);
}

/* moe_write_file_atomic, the writer under every file the library writes: whole bytes, an overwrite
 * without a leftover temporary, and a failure that names the path and leaves nothing behind. */
TEST(write_file_atomic) {
  char p[512], bad[512];
  test_tmp_path("whole.txt", p, sizeof p);
  ASSERT_OK(moe_write_file_atomic(p, "first version\n", 14));
  ASSERT_OK(moe_write_file_atomic(p, "second", 6));
  size_t len = 0;
  char *got = test_read_file(p, &len);
  ASSERT(got != NULL);
  int same = len == 6 && !memcmp(got, "second", 6);
  free(got);
  ASSERT(same);
  ASSERT_EQ_INT(tmp_dir_has("whole.txt.tmp"), 0);
  test_tmp_path("no/such/dir/x.txt", bad, sizeof bad);
  ASSERT_STATUS(moe_write_file_atomic(bad, "x", 1), MOE_ERR_IO);
  ASSERT(strstr(moe_last_error(), "x.txt") != NULL);
  ASSERT(strstr(moe_last_error(), "No such file") != NULL);
  ASSERT_STATUS(moe_write_file_atomic(p, NULL, 3), MOE_ERR_ARG);
}

/* A pid that has exited (and was reaped), for temporary files of a killed writer. */
static pid_t dead_pid(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  return pid > 0 && waitpid(pid, NULL, 0) == pid ? pid : -1;
}

/* issue 21: a writer killed mid-write (kill -9) leaves path.tmp.<pid>; the next write of path removes
 * it, and leaves alone the temporary file of a live pid, a locked one (a writer on another host),
 * another path's and other names. */
TEST(write_file_atomic_removes_stale_tmp) {
  pid_t dead = dead_pid(), dead2 = dead_pid();
  ASSERT(dead > 0 && dead2 > 0);
  char p[512], q[512], stale[600], live[600], locked[600], other[600], odd[600];
  test_tmp_path("stale.bin", p, sizeof p);
  test_tmp_path("other.bin", q, sizeof q);
  snprintf(stale, sizeof stale, "%s.tmp.%d", p, (int)dead);
  snprintf(live, sizeof live, "%s.tmp.%d", p, (int)getppid());
  snprintf(locked, sizeof locked, "%s.tmp.%d", p, (int)dead2);
  snprintf(other, sizeof other, "%s.tmp.%d", q, (int)dead);
  snprintf(odd, sizeof odd, "%s.tmp.%dx", p, (int)dead);
  const char *planted[5] = {stale, live, locked, other, odd};
  for (int i = 0; i < 5; i++) ASSERT_OK(moe_write_file_atomic(planted[i], "partial", 7));
  int fd = open(locked, O_RDONLY);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(flock(fd, LOCK_EX), 0);
  moe_status st = moe_write_file_atomic(p, "whole", 5);
  close(fd);
  ASSERT_OK(st);
  char got[16];
  test_read_text(p, got, sizeof got);
  ASSERT(!strcmp(got, "whole"));
  if (access(stale, F_OK) == 0) FAIL_("%s (pid %d, exited) was not removed", stale, (int)dead);
  for (int i = 1; i < 5; i++)
    if (access(planted[i], F_OK) != 0) FAIL_("%s was removed", planted[i]);
  ASSERT_OK(moe_write_file_atomic(p, "again", 5)); /* its lock released: removed now */
  if (access(locked, F_OK) == 0) FAIL_("%s (pid %d, exited, unlocked) was not removed", locked, (int)dead2);
}

TEST(st_writer_rejects_bad_arguments) {
  moe_st_writer *w = NULL;
  ASSERT_OK(moe_st_writer_new(&w));
  float x[4] = {0};
  int64_t ok1[1] = {4}, neg[2] = {2, -1}, many[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  moe_status s[6];
  char msg[6][256];
  s[0] = moe_st_writer_add(w, "w", MOE_DT_F32, 1, ok1, x);
  s[1] = moe_st_writer_add(w, "w", MOE_DT_F32, 1, ok1, x);
  snprintf(msg[1], 256, "%s", moe_last_error());
  s[2] = moe_st_writer_add(w, "bad_dt", MOE_DT_COUNT, 1, ok1, x);
  snprintf(msg[2], 256, "%s", moe_last_error());
  s[3] = moe_st_writer_add(w, "neg", MOE_DT_F32, 2, neg, x);
  snprintf(msg[3], 256, "%s", moe_last_error());
  s[4] = moe_st_writer_add(w, "many", MOE_DT_F32, 9, many, x);
  s[5] = moe_st_writer_add(w, "", MOE_DT_F32, 1, ok1, x);
  moe_st_writer_free(w);
  ASSERT_OK(s[0]);
  ASSERT_STATUS(s[1], MOE_ERR_ARG);
  ASSERT(strstr(msg[1], "'w'") && strstr(msg[1], "twice"));
  ASSERT_STATUS(s[2], MOE_ERR_ARG);
  ASSERT(strstr(msg[2], "bad_dt") && strstr(msg[2], "dtype"));
  ASSERT_STATUS(s[3], MOE_ERR_ARG);
  ASSERT(strstr(msg[3], "neg") && strstr(msg[3], "-1"));
  ASSERT_STATUS(s[4], MOE_ERR_ARG);
  ASSERT_STATUS(s[5], MOE_ERR_ARG);
}

TEST(st_get_missing_and_at_out_of_range) {
  char p[512];
  ASSERT(write_raw(test_tmp_path("miss.safetensors", p, sizeof p), "{" ENTRY("x", "F32", "[1]", 0, 4) "}", 0, 4));
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  moe_tensor_view v;
  moe_status s1 = moe_st_get(f, "gate.weight", &v);
  char e1[1024];
  snprintf(e1, sizeof e1, "%s", moe_last_error());
  moe_status s2 = moe_st_at(f, 1, &v), s3 = moe_st_at(f, -1, &v);
  moe_st_close(f);
  ASSERT_STATUS(s1, MOE_ERR_MISSING);
  ASSERT(strstr(e1, "no tensor 'gate.weight'") && strstr(e1, "miss.safetensors"));
  ASSERT_STATUS(s2, MOE_ERR_ARG);
  ASSERT_STATUS(s3, MOE_ERR_ARG);
}

/* A header as Python's json.dumps writes it, __metadata__ first, padded with spaces as HF does. */
TEST(st_reads_python_style_header) {
  char p[512];
  const char *json = "{\"__metadata__\": {\"format\": \"pt\"}, " ENTRY("w", "F32", "[2, 1]", 0, 8) ", "
                     ENTRY("i", "U8", "[3]", 8, 11) "}       ";
  ASSERT(write_raw(test_tmp_path("py.safetensors", p, sizeof p), json, 0, 11));
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  moe_tensor_view v, u;
  moe_status s1 = moe_st_get(f, "w", &v), s2 = moe_st_get(f, "i", &u);
  const char *fmt = moe_st_meta(f, "format");
  int fmt_ok = fmt && !strcmp(fmt, "pt");
  unsigned char b[11];
  if (!s1 && !s2) memcpy(b, v.data, 8), memcpy(b + 8, u.data, 3);
  moe_st_close(f);
  ASSERT_OK(s1);
  ASSERT_OK(s2);
  ASSERT(fmt_ok);
  ASSERT_EQ_INT(v.shape[0], 2);
  ASSERT_EQ_INT(v.shape[1], 1);
  ASSERT_EQ_INT(u.dtype, MOE_DT_U8);
  for (int i = 0; i < 11; i++) ASSERT_EQ_INT(b[i], i);
}

TEST(st_bad_nonexistent_file) {
  moe_st *f = NULL;
  char p[512];
  ASSERT_STATUS(moe_st_open(&f, test_tmp_path("does-not-exist.safetensors", p, sizeof p)), MOE_ERR_IO);
  ASSERT(f == NULL);
  ASSERT(strstr(moe_last_error(), "does-not-exist.safetensors"));
  ASSERT(strstr(moe_last_error(), "No such file"));
}

TEST(st_bad_truncated_file) {
  char p[512];
  FILE *fp = fopen(test_tmp_path("trunc.safetensors", p, sizeof p), "wb");
  ASSERT(fp && fwrite("\x10\0\0\0\0", 1, 5, fp) == 5 && fclose(fp) == 0);
  moe_st *f = NULL;
  ASSERT_STATUS(moe_st_open(&f, p), MOE_ERR_FORMAT);
  ASSERT(strstr(moe_last_error(), "5 bytes") && strstr(moe_last_error(), "trunc.safetensors"));
}

TEST(st_bad_header_length_zero) { EXPECT_BAD("hzero", "", 0, 0, MOE_ERR_FORMAT, "header length is 0"); }
TEST(st_bad_header_longer_than_file) {
  EXPECT_BAD("hlong", "{}", 1000, 0, MOE_ERR_FORMAT, "header length 1000 exceeds the file size");
}
TEST(st_bad_header_oversized) {
  EXPECT_BAD("hhuge", "{}", UINT64_C(1) << 40, 0, MOE_ERR_FORMAT, "1099511627776 exceeds the limit");
}
TEST(st_bad_invalid_json) {
  EXPECT_BAD("badjson", "{\"a\": {\"dtype\": \"F32\",", 0, 0, MOE_ERR_FORMAT, "not valid JSON");
}
TEST(st_bad_json_not_object) { EXPECT_BAD("notobj", "[1, 2]", 0, 0, MOE_ERR_FORMAT, "not a JSON object"); }
TEST(st_bad_trailing_garbage) { EXPECT_BAD("garbage", "{} x", 0, 0, MOE_ERR_FORMAT, "garbage"); }
TEST(st_bad_unknown_dtype) {
  EXPECT_BAD("dtype", "{" ENTRY("w", "F8_E4M3", "[2]", 0, 2) "}", 0, 2, MOE_ERR_DTYPE, "unknown dtype 'F8_E4M3'");
}
TEST(st_bad_entry_not_object) { EXPECT_BAD("entry", "{\"w\": [1]}", 0, 0, MOE_ERR_FORMAT, "'w'"); }
TEST(st_bad_unknown_key) {
  EXPECT_BAD("ukey", "{\"w\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4], \"x\": 1}}", 0, 4,
             MOE_ERR_FORMAT, "unknown key 'x'");
}
TEST(st_bad_missing_field) {
  EXPECT_BAD("nooff", "{\"w\": {\"dtype\": \"F32\", \"shape\": []}}", 0, 4, MOE_ERR_FORMAT, "missing 'data_offsets'");
}
TEST(st_bad_dtype_not_string) {
  EXPECT_BAD("dtnum", "{\"w\": {\"dtype\": 4, \"shape\": [], \"data_offsets\": [0, 4]}}", 0, 4, MOE_ERR_FORMAT,
             "dtype is 4");
}
TEST(st_bad_negative_dim) {
  EXPECT_BAD("negdim", "{" ENTRY("w", "F32", "[2, -1]", 0, 0) "}", 0, 0, MOE_ERR_FORMAT, "shape[1] = -1");
}
TEST(st_bad_fractional_dim) {
  EXPECT_BAD("fracdim", "{" ENTRY("w", "F32", "[1.5]", 0, 4) "}", 0, 4, MOE_ERR_FORMAT, "shape[0] = 1.5");
}
TEST(st_bad_too_many_dims) {
  EXPECT_BAD("ndim", "{" ENTRY("w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 0, 4, MOE_ERR_FORMAT, "9 dims");
}
TEST(st_bad_element_count_overflow) {
  EXPECT_BAD("ovf", "{" ENTRY("w", "F32", "[4294967296, 4294967296, 2]", 0, 8) "}", 0, 8, MOE_ERR_FORMAT,
             "overflow");
}
TEST(st_bad_shape_byte_count_mismatch) {
  EXPECT_BAD("mismatch", "{" ENTRY("w", "F32", "[2, 3]", 0, 20) "}", 0, 20, MOE_ERR_FORMAT,
             "span 20 bytes but shape and dtype F32 need 24");
}
TEST(st_bad_offsets_reversed) {
  EXPECT_BAD("rev", "{" ENTRY("w", "U8", "[0]", 4, 2) "}", 0, 4, MOE_ERR_FORMAT, "begin 4 > end 2");
}
TEST(st_bad_offsets_not_pair) {
  EXPECT_BAD("pair", "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0]}}", 0, 1, MOE_ERR_FORMAT,
             "data_offsets");
}
TEST(st_bad_offsets_out_of_range) {
  EXPECT_BAD("range", "{" ENTRY("w", "F32", "[4]", 0, 16) "}", 0, 12, MOE_ERR_FORMAT,
             "end 16 is beyond the data region of 12 bytes");
}
TEST(st_bad_overlap) {
  EXPECT_BAD("overlap", "{" ENTRY("a", "F32", "[2]", 0, 8) ", " ENTRY("b", "F32", "[2]", 4, 12) "}", 0, 12,
             MOE_ERR_FORMAT, "'a' and 'b' overlap");
}
TEST(st_bad_hole) {
  EXPECT_BAD("hole", "{" ENTRY("a", "F32", "[1]", 0, 4) ", " ENTRY("b", "F32", "[1]", 8, 12) "}", 0, 12,
             MOE_ERR_FORMAT, "hole in the data region: bytes [4, 8)");
}
TEST(st_bad_trailing_bytes) {
  EXPECT_BAD("trail", "{" ENTRY("a", "F32", "[1]", 0, 4) "}", 0, 7, MOE_ERR_FORMAT, "3 trailing bytes");
}
TEST(st_bad_misaligned) {
  EXPECT_BAD("misal", "{" ENTRY("u", "U8", "[2]", 0, 2) ", " ENTRY("f", "F32", "[1]", 2, 6) "}", 0, 6,
             MOE_ERR_FORMAT, "'f': data offset 2 is misaligned for F32");
}
TEST(st_bad_duplicate_names) {
  EXPECT_BAD("dup", "{" ENTRY("w", "F32", "[1]", 0, 4) ", " ENTRY("w", "F32", "[1]", 4, 8) "}", 0, 8,
             MOE_ERR_FORMAT, "duplicate tensor name 'w'");
}
TEST(st_bad_empty_name) {
  EXPECT_BAD("noname", "{" ENTRY("", "F32", "[1]", 0, 4) "}", 0, 4, MOE_ERR_FORMAT, "empty tensor name");
}
TEST(st_bad_metadata_not_string) {
  EXPECT_BAD("meta", "{\"__metadata__\": {\"ok\": \"1\", \"top_k\": 2}, " ENTRY("w", "F32", "[1]", 0, 4) "}", 0, 4,
             MOE_ERR_FORMAT, "__metadata__ 'top_k' is 2, not a string");
}
TEST(st_bad_metadata_duplicate_key) {
  EXPECT_BAD("metadup", "{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}", 0, 0, MOE_ERR_FORMAT,
             "duplicate __metadata__ key 'k'");
}

/* A failure inside moe_layer_init while loading a file comes back prefixed with the file's path, once,
 * and the inner message intact (the prefix is formatted from moe_last_error() itself). */
TEST(load_error_is_prefixed_by_the_path) {
  const char *p = MOE_FIXTURE_DIR "/cosine_gelu_k2_dynamic/w.safetensors";
  moe_st *f = NULL;
  ASSERT_OK(moe_st_open(&f, p));
  moe_layer_overrides o;
  moe_layer_overrides_init(&o);
  o.top_k = 99;
  moe_layer_t l;
  moe_status st = moe_layer_load(&l, f, &o);
  moe_st_close(f);
  ASSERT_STATUS(st, MOE_ERR_ARG);
  const char *m = moe_last_error();
  size_t n = strlen(p);
  if (strncmp(m, p, n) || strncmp(m + n, ": ", 2) || strstr(m + n, p) || !strstr(m, "top_k must be in [1, E=6], got 99"))
    FAIL_("message '%s'", m);
}
