/* A background thread and the mutex, condition variable and stop flag its owner shares with it (the
 * RECOMPILE trigger thread, the expert cache's loader): starting it, and stopping it for good. */
#ifndef MOE_WORKER_H
#define MOE_WORKER_H

#include <pthread.h>


typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop; /* set under mu by moe__worker_stop: the thread's loop returns once it sees it */
  pthread_t thread;
} moe__worker;

/* Initializes w and runs fn(arg) on a new thread; returns 0 when the thread could not start (nothing is
 * left to destroy then). */
int moe__worker_start(moe__worker *w, void *(*fn)(void *), void *arg);
/* Sets stop, wakes the thread, joins it, and destroys the mutex and the condition variable. */
void moe__worker_stop(moe__worker *w);

#endif
