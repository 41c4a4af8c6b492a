/* A synthetic 10-class IDX data set (12x12 images, each class a noisy blob at its own place; 600
 * training and 200 test samples), written once per test run under the runner's scratch directory. */
#ifndef MOE_TEST_SYNTH_H
#define MOE_TEST_SYNTH_H

/* The directory holding train-* and t10k-* IDX files. */
const char *synth_data_dir(void);

#endif
