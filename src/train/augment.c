/* See augment.h. */
#include <math.h>

#include "train/augment.h"

void moe__augment_warp(const float *src, float *dst, int R, int C, double deg, double zoom, int dy, int dx) {
  double a = deg * 3.14159265358979323846 / 180.0, cs = cos(a) / zoom, sn = sin(a) / zoom;
  double cy = (R - 1) * 0.5, cx = (C - 1) * 0.5;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      double vr = r - cy - dy, vc = c - cx - dx; /* the inverse map: undo the shift, then the rotation and scale */
      double sr = cs * vr + sn * vc + cy, sc = -sn * vr + cs * vc + cx;
      double v = 0;
      if (sr > -1 && sr < R && sc > -1 && sc < C) { /* else no neighbour is inside */
        int r0 = (int)(sr + 1) - 1, c0 = (int)(sc + 1) - 1; /* floor: the casts truncate positive values */
        double fr = sr - r0, fc = sc - c0;
        if (r0 >= 0 && r0 + 1 < R && c0 >= 0 && c0 + 1 < C) { /* all four inside: the loop below, unrolled */
          const float *p = src + r0 * C + c0;
          v = (1 - fr) * (1 - fc) * p[0] + (1 - fr) * fc * p[1] + fr * (1 - fc) * p[C] + fr * fc * p[C + 1];
        } else
          for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
              int rr = r0 + i, cc = c0 + j;
              if (rr >= 0 && rr < R && cc >= 0 && cc < C) v += (i ? fr : 1 - fr) * (j ? fc : 1 - fc) * src[rr * C + cc];
            }
      }
      dst[r * C + c] = (float)v;
    }
}
