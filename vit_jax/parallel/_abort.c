/* SIGABRT in a multi-process run, decided without Python (parallel/distributed.py).

JAX's distributed client aborts the process at once when the coordination service stops
answering (process 0 gone) or reports a peer lost; so do XLA's CHECK failures, a corrupt
heap and std::terminate. Only the first kind means "run the same command again" (exit
status 75). The handler here runs inside abort(), where Python must not run (the GIL, the
allocator, stderr's lock): it raises a flag and waits, sleeping, for `verdict` from the
peers' watcher thread, which asks the coordination service whether a peer is lost.

  lost (verdict 1)    the watcher's line, then _exit(75);
  crash (verdict 2)   the crash line, then SIGABRT again with the action from before
                      `install` (the default's: the abort's own status, 134 in a shell,
                      and its core dump; Python's faulthandler's where it was enabled);
  none in time        the unjudged line, then as a crash. A watcher that cannot run (the
                      abort came with the GIL held, or the coordinator froze) gives none.

Only the first thread to abort judges; another one aborting meanwhile waits for the end.
Every call in the handler is async-signal-safe (write, clock_gettime, nanosleep,
sigaction, raise, _exit, pause); the flags are lock-free atomics.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LINE 2048

static int pending = 0, verdict = 0, entered = 0; /* __atomic_* only */
static char lost_line[LINE], crash_line[LINE], unjudged_line[LINE];
static size_t lost_len = 0, crash_len = 0, unjudged_len = 0;
static long wait_ms = 0;
static struct sigaction before;
static int installed = 0;

static void put(const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(2, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void on_abort(int sig) {
  (void)sig;
  if (__atomic_exchange_n(&entered, 1, __ATOMIC_ACQ_REL))
    for (;;) pause(); /* another thread judges, and ends the process */
  __atomic_store_n(&pending, 1, __ATOMIC_RELEASE);
  struct timespec tick = {0, 20 * 1000 * 1000};
  double end = now() + wait_ms / 1000.0;
  int v;
  while ((v = __atomic_load_n(&verdict, __ATOMIC_ACQUIRE)) == 0 && now() < end)
    nanosleep(&tick, NULL);
  if (v == 1) {
    put(lost_line, lost_len);
    _exit(75);
  }
  if (v == 2)
    put(crash_line, crash_len);
  else
    put(unjudged_line, unjudged_len);
  sigaction(SIGABRT, &before, NULL);
  raise(SIGABRT); /* delivered as the handler returns */
}

static int copy_line(const char *s, Py_ssize_t n, char *to, size_t *len) {
  if (n < 0 || (size_t)n >= LINE) {
    PyErr_Format(PyExc_ValueError, "a line of %zd bytes; at most %d", n, LINE - 1);
    return -1;
  }
  memcpy(to, s, (size_t)n);
  *len = (size_t)n;
  return 0;
}

static PyObject *install(PyObject *self, PyObject *args) {
  const char *crash, *unjudged;
  Py_ssize_t n, m;
  double seconds;
  if (!PyArg_ParseTuple(args, "y#y#d", &crash, &n, &unjudged, &m, &seconds)) return NULL;
  if (copy_line(crash, n, crash_line, &crash_len) < 0) return NULL;
  if (copy_line(unjudged, m, unjudged_line, &unjudged_len) < 0) return NULL;
  wait_ms = (long)(seconds * 1000);
  __atomic_store_n(&pending, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&verdict, 0, __ATOMIC_RELEASE);
  struct sigaction act;
  memset(&act, 0, sizeof act);
  act.sa_handler = on_abort;
  sigemptyset(&act.sa_mask);
  if (sigaction(SIGABRT, &act, installed ? NULL : &before) != 0)
    return PyErr_SetFromErrno(PyExc_OSError);
  installed = 1;
  Py_RETURN_NONE;
}

static PyObject *uninstall(PyObject *self, PyObject *unused) {
  if (installed && sigaction(SIGABRT, &before, NULL) != 0)
    return PyErr_SetFromErrno(PyExc_OSError);
  installed = 0;
  Py_RETURN_NONE;
}

static PyObject *is_pending(PyObject *self, PyObject *unused) {
  return PyBool_FromLong(__atomic_load_n(&pending, __ATOMIC_ACQUIRE));
}

static PyObject *lost(PyObject *self, PyObject *args) {
  const char *line;
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "y#", &line, &n)) return NULL;
  if (copy_line(line, n, lost_line, &lost_len) < 0) return NULL;
  __atomic_store_n(&verdict, 1, __ATOMIC_RELEASE); /* the line before the verdict */
  Py_RETURN_NONE;
}

static PyObject *crashed(PyObject *self, PyObject *unused) {
  __atomic_store_n(&verdict, 2, __ATOMIC_RELEASE);
  Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"install", install, METH_VARARGS,
     "install(crash_line, unjudged_line: bytes, seconds): SIGABRT waits for a verdict"},
    {"uninstall", uninstall, METH_NOARGS, "the SIGABRT action from before install"},
    {"pending", is_pending, METH_NOARGS, "whether an abort waits for a verdict"},
    {"lost", lost, METH_VARARGS, "lost(line: bytes): the abort prints `line`, exits 75"},
    {"crashed", crashed, METH_NOARGS, "the abort is a crash: its own status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_abort", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__abort(void) { return PyModule_Create(&MODULE); }
