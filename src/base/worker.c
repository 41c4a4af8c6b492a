/* Background threads with a shared mutex, condition variable and stop flag (see worker.h). */
#include "base/worker.h"

int moe__worker_start(moe__worker *w, void *(*fn)(void *), void *arg) {
  w->stop = 0;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  if (pthread_create(&w->thread, NULL, fn, arg) == 0) return 1;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  return 0;
}

void moe__worker_stop(moe__worker *w) {
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}
