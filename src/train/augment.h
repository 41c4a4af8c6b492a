/* The random distortions of the classifier's training images (moe_augment): a whole-pixel shift, and a
 * rotation and scaling about the image's centre sampled bilinearly. The draws are classifier.c's
 * (functions of seed, epoch and position); this file only moves pixels, so tests can check it against
 * exact cases. */
#ifndef MOE_TRAIN_AUGMENT_H
#define MOE_TRAIN_AUGMENT_H

/* dst (R, C) = src rotated by `deg` degrees (counter-clockwise as displayed, rows going down) and
 * scaled by `zoom` about the centre ((R-1)/2, (C-1)/2), then shifted by dy rows and dx columns: each
 * output pixel samples src bilinearly at its inverse image, zero outside. */
void moe__augment_warp(const float *src, float *dst, int R, int C, double deg, double zoom, int dy, int dx);

#endif
