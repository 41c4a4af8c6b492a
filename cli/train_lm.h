/* moe train --task lm and moe eval --task lm: the language model's commands, which cmd_train and
 * cmd_eval dispatch to on --task lm. */
#ifndef MOE_CLI_TRAIN_LM_H
#define MOE_CLI_TRAIN_LM_H

int cmd_train_lm(int argc, char **argv);
int cmd_eval_lm(int argc, char **argv);

#endif
