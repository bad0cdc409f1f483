/* A JPEG's crop window decoded as tf.image.decode_and_crop_jpeg decodes it (big_vision's
 * training crops): the same libjpeg-turbo calls as TensorFlow's jpeg_mem.cc, so the same
 * pixels. jpeg_crop_scanline widens the window left to an iMCU boundary and
 * jpeg_skip_scanlines passes the rows above it; nothing below it is decoded. 4:2:0
 * upsampling then treats the window's edges as the image's, which is why a full decode
 * sliced afterwards differs in the window's first and last columns.
 *
 * decode(data, top, left, height, width, fast) -> bytearray of height * width * 3 (RGB),
 * fast: the integer-fast DCT (TensorFlow's) or the accurate one. Grayscale comes out as
 * RGB; CMYK and YCCK as TensorFlow converts them. Any libjpeg error or corrupt-data
 * warning raises ValueError with libjpeg's message: the caller then decodes the file as
 * before (vit_jax/data/crop_decode.py). A window that is empty or not inside the image,
 * however large its numbers, is a ValueError naming it, found before anything is
 * allocated (crop_decode.py checks it too). The GIL is released while decoding. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

typedef struct {
  struct jpeg_error_mgr mgr; /* first: libjpeg passes &mgr as cinfo->err */
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
} Errors;

static void fail(j_common_ptr cinfo) {
  Errors *err = (Errors *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

/* Level -1 is a corrupt-data warning (a truncated file, extraneous bytes): a failure
 * here, as it is for simplejpeg, so that such a file takes the pipeline's usual path. */
static void warn(j_common_ptr cinfo, int level) {
  if (level < 0) fail(cinfo);
}

/* One output row of the widened window -> `width` RGB pixels from `shift` on. TensorFlow's
 * CMYK conversion: Adobe files store inverted inks. */
static void copy_row(const JSAMPLE *row, int shift, int width, int cmyk, int adobe,
                     unsigned char *out) {
  if (!cmyk) {
    memcpy(out, row + 3 * shift, 3 * (size_t)width);
    return;
  }
  for (int i = 0; i < width; i++) {
    const JSAMPLE *p = row + 4 * (shift + i);
    int k = p[3];
    for (int c = 0; c < 3; c++)
      out[3 * i + c] = adobe ? k * p[c] / 255 : (255 - k) * (255 - p[c]) / 255;
  }
}

/* Reads `data`'s header into `cinfo`; 0, or -1 with err->message set and `cinfo`
 * destroyed. Runs with the GIL: it only parses markers. */
static int open_jpeg(j_decompress_ptr cinfo, const unsigned char *data, size_t size,
                     Errors *err) {
  cinfo->err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = fail;
  err->mgr.emit_message = warn;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(cinfo);
    return -1;
  }
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, (unsigned long)size);
  jpeg_read_header(cinfo, TRUE);
  return 0;
}

/* The window (top, left, height, width) of the opened image, which `decode` found inside
 * it, into `out`; 0, or -1 with err->message set. `cinfo` is destroyed either way. Runs
 * without the GIL: no Python calls in here. */
static int decode_window(j_decompress_ptr cinfo, const int *win, int fast,
                         unsigned char *out, Errors *err) {
  JSAMPLE *volatile row = NULL; /* volatile: read again after a longjmp */
  if (setjmp(err->jump)) {
    free(row);
    jpeg_destroy_decompress(cinfo);
    return -1;
  }
  int cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo->dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE; /* TensorFlow's fancy_upscaling default */
  int top = win[0], left = win[1], height = win[2], width = win[3];
  jpeg_start_decompress(cinfo);
  JDIMENSION x = (JDIMENSION)left, w = (JDIMENSION)width;
  jpeg_crop_scanline(cinfo, &x, &w); /* x down to the iMCU, w widened to match */
  jpeg_skip_scanlines(cinfo, (JDIMENSION)top);
  row = malloc((size_t)cinfo->output_width * cinfo->output_components);
  if (row == NULL) {
    strcpy(err->message, "out of memory");
    jpeg_destroy_decompress(cinfo);
    return -1;
  }
  for (int y = 0; y < height; y++) {
    JSAMPLE *rows[1] = {row};
    jpeg_read_scanlines(cinfo, rows, 1); /* a memory source never suspends */
    copy_row(row, left - (int)x, width, cmyk, cinfo->saw_Adobe_marker,
             out + (size_t)y * width * 3);
  }
  free(row);
  jpeg_destroy_decompress(cinfo); /* the rows below the window are never decoded */
  return 0;
}

/* The window's four numbers as long long: an int too large either way becomes
 * LLONG_MAX or LLONG_MIN, which no image holds, so no sum or product below overflows. */
static int window_of(PyObject *const *objects, long long *win) {
  for (int i = 0; i < 4; i++) {
    int overflow;
    win[i] = PyLong_AsLongLongAndOverflow(objects[i], &overflow);
    if (win[i] == -1 && PyErr_Occurred()) return -1;
    if (overflow) win[i] = overflow > 0 ? LLONG_MAX : LLONG_MIN;
  }
  return 0;
}

/* A ValueError naming the window: "crop window (top, left, height, width) <what>". */
static PyObject *refuse(PyObject *const *objects, const char *what) {
  return PyErr_Format(PyExc_ValueError, "crop window (%S, %S, %S, %S) %s", objects[0],
                      objects[1], objects[2], objects[3], what);
}

/* Every check comes before anything is allocated: the window non-empty, then (the header
 * read) inside the image. libjpeg bounds the image's sides (JPEG_MAX_DIMENSION), so a
 * window inside it fits an int and its height * width * 3 bytes a Py_ssize_t. */
static PyObject *decode(PyObject *self, PyObject *args) {
  Py_buffer data;
  PyObject *objects[4], *out = NULL;
  long long v[4];
  int win[4], fast, status;
  char inside[64];
  Errors err;
  struct jpeg_decompress_struct cinfo;
  if (!PyArg_ParseTuple(args, "y*OOOOp", &data, &objects[0], &objects[1], &objects[2],
                        &objects[3], &fast))
    return NULL;
  if (window_of(objects, v) != 0) {
    /* not integers: its TypeError */
  } else if (v[2] <= 0 || v[3] <= 0) {
    refuse(objects, "is empty");
  } else if (open_jpeg(&cinfo, data.buf, (size_t)data.len, &err) != 0) {
    PyErr_Format(PyExc_ValueError, "%s", err.message);
  } else if (v[0] < 0 || v[1] < 0 || v[2] > (long long)cinfo.image_height - v[0] ||
             v[3] > (long long)cinfo.image_width - v[1] || v[2] > PY_SSIZE_T_MAX / 3 / v[3]) {
    snprintf(inside, sizeof inside, "is not inside the %ux%u image", cinfo.image_height,
             cinfo.image_width);
    jpeg_destroy_decompress(&cinfo);
    refuse(objects, inside);
  } else if ((out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(v[2] * v[3] * 3))) ==
             NULL) {
    jpeg_destroy_decompress(&cinfo);
  } else {
    for (int i = 0; i < 4; i++) win[i] = (int)v[i];
    unsigned char *pixels = (unsigned char *)PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    status = decode_window(&cinfo, win, fast, pixels, &err);
    Py_END_ALLOW_THREADS
    if (status != 0) {
      Py_CLEAR(out);
      PyErr_Format(PyExc_ValueError, "%s", err.message);
    }
  }
  PyBuffer_Release(&data);
  return out;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "decode(data, top, left, height, width, fast) -> bytearray"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crop_decode",
                                    "A JPEG's crop window, as tf.image.decode_and_crop_jpeg.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__crop_decode(void) { return PyModule_Create(&module); }
