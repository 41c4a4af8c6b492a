/* The random distortions of moe train's images: a whole-pixel shift, and a rotation and scaling about
 * the image's centre sampled bilinearly. The draws are train_data.c's (functions of seed, epoch and
 * position); this file only moves pixels, so tests can check it against exact cases. */
#ifndef MOE_AUGMENT_H
#define MOE_AUGMENT_H

/* --augment PX, --augment-rotate DEG, --augment-scale F: a shift of up to `shift` pixels each way, then,
 * when rotate or scale is not 0, a rotation by up to +-rotate degrees and a scaling by a factor in
 * [1 - scale, 1 + scale]. */
typedef struct {
  int shift;
  float rotate, scale;
} train_augment;

/* dst (R, C) = src rotated by `deg` degrees (counter-clockwise as displayed, rows going down) and
 * scaled by `zoom` about the centre ((R-1)/2, (C-1)/2), then shifted by dy rows and dx columns: each
 * output pixel samples src bilinearly at its inverse image, zero outside. */
void augment_warp(const float *src, float *dst, int R, int C, double deg, double zoom, int dy, int dx);

#endif
