/* ort-cpu-run: the float ONNX graph on the phone's CPU with ONNX Runtime's CPU execution provider, the CPU baseline
 * of `doit profile` and the CPU path of `doit power` (docs/device.md, "CPU baseline"). Built for aarch64 Linux
 * (glibc) by `python -m build_rules.device cpu-runtime`; on the phone it runs through the pushed glibc loader:
 *   ld-linux-aarch64.so.1 --library-path DIR DIR/ort-cpu-run --model M.onnx --input_list L --output_dir D \
 *     --input NAME=1x3x16x16:float32 ... --output NAME=1x64 ... [--num_inferences N | --duration S]
 *     [--keep_num_outputs K] [--threads T]
 * The flags follow qnn-net-run's where they mean the same: input_list lines of `NAME:=PATH` raw files (the --input
 * dtype: float32, int32 or int64), outputs Result_<n>/<NAME>.raw (float32), one inference per line, cycling the list.
 * D/timings.csv: `event,microseconds` rows, one `load` (session creation) and one `run` per inference.
 *
 * ONNX Runtime's C API is used through OrtGetApiBase()->GetApi(version) and the OrtApi function table, whose
 * member order is append-only across releases: the indices below are the members' positions (API version 1 on). No
 * ONNX Runtime header is needed to build this file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef void *Status; /* OrtStatus*: NULL on success */
typedef struct {
  const void *(*GetApi)(uint32_t version);
  const char *(*GetVersionString)(void);
} ApiBase;
extern const ApiBase *OrtGetApiBase(void);

enum { /* positions in OrtApi */
  GET_ERROR_MESSAGE = 2, CREATE_ENV = 3, CREATE_SESSION = 7, RUN = 9, CREATE_SESSION_OPTIONS = 10,
  SET_INTRA_OP_NUM_THREADS = 24, CREATE_TENSOR_WITH_DATA = 49, GET_TENSOR_MUTABLE_DATA = 51,
  CREATE_CPU_MEMORY_INFO = 69, RELEASE_VALUE = 96
};
enum { ELEMENT_FLOAT = 1, ELEMENT_INT32 = 6, ELEMENT_INT64 = 7 };
#define API_VERSION 10 /* ONNX Runtime 1.10 (2021) or newer */
#define MAX_TENSORS 64
#define MAX_DIMS 8

static void *const *api;

typedef struct {
  char *name;
  int64_t dims[MAX_DIMS];
  size_t rank, count, element_size;
  int type;
} Tensor;

static void fail(const char *what, const char *detail) {
  fprintf(stderr, "ort-cpu-run: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static void check(Status status, const char *what) {
  if (status) fail(what, ((const char *(*)(Status))api[GET_ERROR_MESSAGE])(status));
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* NAME=D0xD1x...[:float32|int32|int64] */
static void parse_tensor(char *spec, Tensor *t) {
  char *eq = strrchr(spec, '=');
  if (!eq) fail("expected NAME=SHAPE[:TYPE], got", spec);
  *eq = 0;
  t->name = spec;
  char *type = strchr(eq + 1, ':');
  t->type = ELEMENT_FLOAT;
  t->element_size = 4;
  if (type) {
    *type++ = 0;
    if (!strcmp(type, "int32")) t->type = ELEMENT_INT32;
    else if (!strcmp(type, "int64")) { t->type = ELEMENT_INT64; t->element_size = 8; }
    else if (strcmp(type, "float32")) fail("type must be float32, int32 or int64, got", type);
  }
  t->rank = 0;
  t->count = 1;
  for (char *dim = strtok(eq + 1, "x"); dim; dim = strtok(NULL, "x")) {
    if (t->rank == MAX_DIMS) fail("too many dimensions in", spec);
    t->dims[t->rank] = strtoll(dim, NULL, 10);
    t->count *= (size_t)t->dims[t->rank++];
  }
}

static void make_dirs(const char *path) { /* mkdir -p */
  char partial[4096];
  snprintf(partial, sizeof partial, "%s", path);
  for (char *slash = strchr(partial + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = 0;
    mkdir(partial, 0755);
    *slash = '/';
  }
  mkdir(partial, 0755);
}

static void *read_file(const char *path, size_t bytes) {
  struct stat st;
  if (stat(path, &st) != 0) fail("cannot open", path);
  if ((size_t)st.st_size != bytes) {
    char detail[600];
    snprintf(detail, sizeof detail, "%s holds %lld bytes, its input needs %zu", path, (long long)st.st_size, bytes);
    fail("wrong input size", detail);
  }
  FILE *f = fopen(path, "rb");
  void *data = malloc(bytes ? bytes : 1);
  if (!f || fread(data, 1, bytes, f) != bytes) fail("cannot read", path);
  fclose(f);
  return data;
}

int main(int argc, char **argv) {
  const char *model = NULL, *input_list = NULL, *output_dir = "./output";
  long inferences = -1, keep = -1, threads = 0;
  double duration = -1;
  Tensor inputs[MAX_TENSORS], outputs[MAX_TENSORS];
  size_t n_in = 0, n_out = 0;
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i];
    if (i + 1 >= argc) fail("a value is missing after", flag);
    char *value = argv[++i];
    if (!strcmp(flag, "--model")) model = value;
    else if (!strcmp(flag, "--input_list")) input_list = value;
    else if (!strcmp(flag, "--output_dir")) output_dir = value;
    else if (!strcmp(flag, "--num_inferences")) inferences = strtol(value, NULL, 10);
    else if (!strcmp(flag, "--duration")) duration = strtod(value, NULL);
    else if (!strcmp(flag, "--keep_num_outputs")) keep = strtol(value, NULL, 10);
    else if (!strcmp(flag, "--threads")) threads = strtol(value, NULL, 10);
    else if (!strcmp(flag, "--input") && n_in < MAX_TENSORS) parse_tensor(value, &inputs[n_in++]);
    else if (!strcmp(flag, "--output") && n_out < MAX_TENSORS) parse_tensor(value, &outputs[n_out++]);
    else fail("unknown flag (or too many tensors)", flag);
  }
  if (!model || !input_list || !n_in || !n_out) fail("--model, --input_list, --input and --output are required", 0);
  if (inferences >= 0 && duration >= 0) fail("--num_inferences and --duration are mutually exclusive", 0);

  /* the input list: one line per sample, NAME:=PATH entries */
  FILE *list = fopen(input_list, "r");
  if (!list) fail("cannot open", input_list);
  void **samples = NULL;
  size_t n_samples = 0;
  char line[16384];
  while (fgets(line, sizeof line, list)) {
    if (line[0] == '\n' || line[0] == '#') continue;
    samples = realloc(samples, (n_samples + 1) * n_in * sizeof(void *));
    void **row = samples + n_samples * n_in;
    memset(row, 0, n_in * sizeof(void *));
    for (char *entry = strtok(line, " \t\r\n"); entry; entry = strtok(NULL, " \t\r\n")) {
      char *sep = strstr(entry, ":=");
      if (!sep) fail("input list entries are NAME:=PATH, got", entry);
      *sep = 0;
      size_t k = 0;
      while (k < n_in && strcmp(inputs[k].name, entry)) k++;
      if (k == n_in) fail("the input list names an input not given by --input", entry);
      row[k] = read_file(sep + 2, inputs[k].count * inputs[k].element_size);
    }
    for (size_t k = 0; k < n_in; k++)
      if (!row[k]) fail("an input list line lacks input", inputs[k].name);
    n_samples++;
  }
  fclose(list);
  if (!n_samples) fail("the input list is empty", input_list);

  const ApiBase *base = OrtGetApiBase();
  api = (void *const *)base->GetApi(API_VERSION);
  if (!api) fail("this libonnxruntime does not offer API version 10", base->GetVersionString());
  void *env, *options, *session, *memory;
  check(((Status(*)(int, const char *, void **))api[CREATE_ENV])(3, "ort-cpu-run", &env), "CreateEnv");
  check(((Status(*)(void **))api[CREATE_SESSION_OPTIONS])(&options), "CreateSessionOptions");
  check(((Status(*)(void *, int))api[SET_INTRA_OP_NUM_THREADS])(options, (int)threads), "SetIntraOpNumThreads");
  double started = now_us();
  check(((Status(*)(void *, const char *, void *, void **))api[CREATE_SESSION])(env, model, options, &session),
        "CreateSession");
  double load = now_us() - started;
  check(((Status(*)(int, int, void **))api[CREATE_CPU_MEMORY_INFO])(0, 0, &memory), "CreateCpuMemoryInfo");

  make_dirs(output_dir);
  char path[4096];
  snprintf(path, sizeof path, "%s/timings.csv", output_dir);
  FILE *timings = fopen(path, "w");
  if (!timings) fail("cannot write", path);
  fprintf(timings, "event,microseconds\nload,%.1f\n", load);

  const char *in_names[MAX_TENSORS], *out_names[MAX_TENSORS];
  for (size_t k = 0; k < n_in; k++) in_names[k] = inputs[k].name;
  for (size_t k = 0; k < n_out; k++) out_names[k] = outputs[k].name;
  if (inferences < 0 && duration < 0) inferences = (long)n_samples;
  if (keep < 0) keep = (long)n_samples;
  double deadline = duration >= 0 ? now_us() + duration * 1e6 : 0;
  long index = 0;
  while (duration >= 0 ? now_us() < deadline : index < inferences) {
    void **row = samples + (index % n_samples) * n_in;
    void *feed[MAX_TENSORS], *results[MAX_TENSORS] = {0};
    for (size_t k = 0; k < n_in; k++)
      check(((Status(*)(void *, void *, size_t, const int64_t *, size_t, int, void **))api[CREATE_TENSOR_WITH_DATA])(
                memory, row[k], inputs[k].count * inputs[k].element_size, inputs[k].dims, inputs[k].rank,
                inputs[k].type, &feed[k]),
            "CreateTensorWithDataAsOrtValue");
    started = now_us();
    check(((Status(*)(void *, void *, const char *const *, void *const *, size_t, const char *const *, size_t,
                      void **))api[RUN])(session, NULL, in_names, feed, n_in, out_names, n_out, results),
          "Run");
    fprintf(timings, "run,%.1f\n", now_us() - started);
    if (index < keep && index < (long)n_samples) {
      snprintf(path, sizeof path, "%s/Result_%ld", output_dir, index);
      mkdir(path, 0755);
      for (size_t k = 0; k < n_out; k++) {
        void *data;
        check(((Status(*)(void *, void **))api[GET_TENSOR_MUTABLE_DATA])(results[k], &data), "GetTensorMutableData");
        snprintf(path, sizeof path, "%s/Result_%ld/%s.raw", output_dir, index, outputs[k].name);
        /* a name with slashes (torchscript's "/head/Gemm_output_0") is a path below Result_<n>, where the host
           reads it (target.result_file), as for qnn-net-run: its folders first */
        char *last = strrchr(path, '/');
        *last = 0;
        make_dirs(path);
        *last = '/';
        FILE *out = fopen(path, "wb");
        if (!out || fwrite(data, 4, outputs[k].count, out) != outputs[k].count) fail("cannot write", path);
        fclose(out);
      }
    }
    for (size_t k = 0; k < n_in; k++) ((void (*)(void *))api[RELEASE_VALUE])(feed[k]);
    for (size_t k = 0; k < n_out; k++) ((void (*)(void *))api[RELEASE_VALUE])(results[k]);
    index++;
  }
  fclose(timings);
  printf("ort-cpu-run: %ld inference(s) of %s on the CPU (ONNX Runtime %s)\n", index, model,
         base->GetVersionString());
  return 0;
}
