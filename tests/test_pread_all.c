/* moe__pread_all (base/pread_all.h): the bytes at an offset read whole; a file that ends first, or a
 * descriptor that cannot be read, an error naming the file, what was read and how much of it. */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/pread_all.h"
#include "test.h"

TEST(pread_all_reads_whole_or_names_the_file_and_what) {
  char path[512];
  test_tmp_path("pread_all.bin", path, sizeof path);
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  for (int i = 0; i < 100; i++) fputc(i, f);
  fclose(f);
  int fd = open(path, O_RDONLY);
  ASSERT(fd >= 0);
  unsigned char b[30], c[16];
  moe_status st = moe__pread_all(fd, path, "tensor 'w'", 70, b, 30); /* exactly to the end */
  moe_status past = moe__pread_all(fd, path, "tensor 'w'", 90, c, 16); /* 10 of 16 bytes there */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", moe_last_error());
  close(fd);
  ASSERT_OK(st);
  for (int i = 0; i < 30; i++) ASSERT_EQ_INT(b[i], 70 + i);
  ASSERT_EQ_INT(past, MOE_ERR_IO);
  if (!strstr(msg, path) || !strstr(msg, "reading tensor 'w': file shrank") || !strstr(msg, "10 of 16 bytes"))
    FAIL_("the message does not name the file, the tensor and the bytes read: %s", msg);
  ASSERT_STATUS(moe__pread_all(fd, path, "the header", 0, b, 4), MOE_ERR_IO); /* closed: the system's reason */
  if (!strstr(moe_last_error(), "reading the header: Bad file descriptor")) FAIL_("%s", moe_last_error());
  ASSERT_OK(moe__pread_all(-1, path, "nothing", 0, b, 0)); /* no bytes: no read */
}
