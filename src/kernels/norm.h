/* LayerNorm over the last dimension, forward and backward (the pre-norm of the model's blocks). */
#ifndef MOE_NORM_H
#define MOE_NORM_H

#define MOE_LN_EPS 1e-5f

/* y (n, d) = (x - mean) * rstd * g + b; keeps mean and rstd (n) for backward. */
void moe__layernorm_forward(const float *x, const float *g, const float *b, int n, int d, float *y,
                            float *mean, float *rstd, int threads);
/* dx (n, d) += gradient through the norm of dy; dg, db (d) += their gradients. */
void moe__layernorm_backward(const float *dy, const float *x, const float *g, const float *mean,
                             const float *rstd, int n, int d, float *dx, float *dg, float *db,
                             int threads);

#endif
