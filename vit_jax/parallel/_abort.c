/* SIGABRT in a multi-process run, decided without Python (parallel/distributed.py).

JAX's distributed client aborts the process at once when the coordination service stops
answering (process 0 gone) or reports a peer lost; so do XLA's CHECK failures, a corrupt
heap and std::terminate. Only the first kind means "run the same command again" (exit
status 75). The handler here runs inside abort(), where Python must not run (the GIL, the
allocator, stderr's lock): it raises a flag and waits, sleeping, for `verdict` from the
peers' watcher thread, which asks the coordination service whether a peer is lost.

  lost (verdict 1)    the watcher's line, then _exit(75);
  anything else       the crash line, then SIGABRT again with its default action: the
                      process ends with the abort's own status (134 in a shell) and its
                      core dump, as without this handler. A watcher that cannot run (the
                      abort came with the GIL held) gives no verdict: a crash.

Every call in the handler is async-signal-safe (write, nanosleep, signal, raise, _exit).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LINE 2048

static volatile sig_atomic_t pending = 0, verdict = 0;
static char lost_line[LINE], crash_line[LINE];
static size_t lost_len = 0, crash_len = 0;
static long wait_ms = 0;
static struct sigaction before;
static int installed = 0;

static void put(const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static void on_abort(int sig) {
  (void)sig;
  pending = 1;
  struct timespec tick = {0, 20 * 1000 * 1000};
  for (long t = 0; t < wait_ms && verdict == 0; t += 20) nanosleep(&tick, NULL);
  if (verdict == 1) {
    put(lost_line, lost_len);
    _exit(75);
  }
  put(crash_line, crash_len);
  signal(SIGABRT, SIG_DFL);
  raise(SIGABRT); /* delivered as the handler returns: the default action */
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
  const char *crash;
  Py_ssize_t n;
  double seconds;
  if (!PyArg_ParseTuple(args, "y#d", &crash, &n, &seconds)) return NULL;
  if (copy_line(crash, n, crash_line, &crash_len) < 0) return NULL;
  wait_ms = (long)(seconds * 1000);
  pending = verdict = 0;
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
  return PyBool_FromLong(pending);
}

static PyObject *lost(PyObject *self, PyObject *args) {
  const char *line;
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "y#", &line, &n)) return NULL;
  if (copy_line(line, n, lost_line, &lost_len) < 0) return NULL;
  __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the line before the verdict */
  verdict = 1;
  Py_RETURN_NONE;
}

static PyObject *crashed(PyObject *self, PyObject *unused) {
  verdict = 2;
  Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"install", install, METH_VARARGS,
     "install(crash_line: bytes, seconds: float): SIGABRT waits `seconds` for a verdict"},
    {"uninstall", uninstall, METH_NOARGS, "the SIGABRT action from before install"},
    {"pending", is_pending, METH_NOARGS, "whether an abort waits for a verdict"},
    {"lost", lost, METH_VARARGS, "lost(line: bytes): the abort prints `line`, exits 75"},
    {"crashed", crashed, METH_NOARGS, "the abort is a crash: its own status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_abort", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__abort(void) { return PyModule_Create(&MODULE); }
