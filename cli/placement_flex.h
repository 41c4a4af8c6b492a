/* moe placement --method flexmoe: FlexMoE's policy maker over a recorded trace. */
#ifndef MOE_CLI_PLACEMENT_FLEX_H
#define MOE_CLI_PLACEMENT_FLEX_H

#include <stdio.h>

void placement_flex_usage(FILE *f);
int placement_flex(int argc, char **argv);

#endif
