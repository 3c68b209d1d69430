/* braid-bench-mpi-peer: OpenMPI's collectives, measured the way nccl-tests measures, so
 * that `braid-bench collectives` can print braid beside OpenMPI in the same run.
 *
 * How braid-bench runs it (in a container, as root, with no network but loopback):
 *
 *   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
 *   mpirun --allow-run-as-root --oversubscribe --bind-to none -np P \
 *     --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo \
 *     --mca mpi_yield_when_idle 1 \
 *     build/tools/braid-bench-mpi-peer --ops all_reduce --min-bytes 8 --max-bytes 64M
 *
 * Why each setting:
 *   --allow-run-as-root and the two OMPI_ALLOW_RUN_AS_ROOT* variables: mpirun refuses to
 *     start as root otherwise; either is enough, both are given so a wrapper that drops
 *     one still works.
 *   --oversubscribe --bind-to none: P may exceed the cores (the CI machine has 2); binding
 *     several ranks to one core would serialise them.
 *   --mca pml ob1 --mca btl self,vader: shared memory only, the fair peer to braid's
 *     single-host transports, and no probing of network devices. Debian's
 *     /etc/openmpi/openmpi-mca-params.conf already drops ucx, openib and ofi, but leaves
 *     btl tcp in; naming the components makes the run independent of that file.
 *   --mca oob_tcp_if_include lo: the runtime's own wire-up stays on loopback whatever
 *     other interfaces the container has.
 *   --mca mpi_yield_when_idle 1: a waiting rank yields the core between polls. With more
 *     ranks than cores, busy polling lets a spinning rank hold the core that the rank it
 *     waits for needs: on the 2-core CI machine at -np 4 an 8-byte all_reduce took about
 *     5 ms without it and about 10 us with it. At -np 2 it made no difference beyond run-to-
 *     run noise, so it is always on.
 *   vader's large-message path is CMA (process_vm_readv) by default, which works here. A
 *     container that forbids ptrace fails with "Read -1, expected ..., errno = 1"; there,
 *     OMPI_MCA_btl_vader_single_copy_mechanism=none falls back to copying through the
 *     shared-memory FIFO.
 *
 * Output: one JSON object per line on stdout, from rank 0 only (diagnostics on stderr):
 *   {"peer":"openmpi","op":"all_reduce","ranks":2,"bytes":1048576,"count":262144,
 *    "dtype":"f32","iters":50,"time_us":123.4,"algbw_gbps":8.5,"busbw_gbps":8.5,"wrong":0}
 * `bytes` is the per-rank buffer as nccl-tests counts it (all_gather: the output buffer;
 * reduce_scatter and all_to_all: the input buffer) and `count` its f32 elements. time_us is
 * the mean per operation, the slowest rank's. `wrong` counts elements, summed over ranks,
 * that differ from the exact expected result of one verification call made after timing.
 * tools/braid_bench/peers/README.md describes the contract in full. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum Op {
  ALL_REDUCE,
  ALL_GATHER,
  REDUCE_SCATTER,
  BROADCAST,
  REDUCE,
  GATHER,
  SCATTER,
  ALL_TO_ALL,
  ALL_GATHER_V,
  ALL_TO_ALL_V,
  BARRIER,
  OP_COUNT
};

static const char* const op_names[OP_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast",    "reduce", "gather",
    "scatter",    "all_to_all", "all_gather_v",   "all_to_all_v", "barrier"};

enum { WARMUP_ITERS = 3, MIN_ITERS = 5, MAX_ITERS = 100000 };
static const double target_seconds = 0.2; /* timed work per size when --iters is not given */
static const float sentinel =
    -1.0f; /* outputs are cleared to this; no expected value is negative */

typedef struct {
  int ops[OP_COUNT]; /* in the order asked for */
  int op_count;
  size_t min_bytes;
  size_t max_bytes;
  int iters; /* 0: adaptive */
} Options;

/* The buffers of one (op, size): `count` elements of the buffer `bytes` describes, `block`
 * the per-rank share for the ops that split it (count / P). The variable-count ops carry
 * their counts and displacements, in elements (MPI's ints). */
typedef struct {
  float* send;
  float* recv;
  size_t count;
  size_t block;
  int *send_counts, *send_displs; /* all_gather_v: send_counts[0] is this rank's part */
  int *recv_counts, *recv_displs;
} Buffers;

/* Exact in f32 for any sum of P of them while P stays below a few hundred thousand. */
static float input_value(int rank, size_t i) {
  return (float)((rank + 1) * (int)(i % 7 + 1));
}

static float reduced_value(int ranks, size_t i) {
  return (float)(ranks * (ranks + 1) / 2 * (int)(i % 7 + 1));
}

/* "64M" -> 67108864. Suffixes K, M, G are powers of 1024; a trailing "B" or "iB" is accepted. */
static int parse_bytes(const char* text, size_t* out) {
  char* end = NULL;
  unsigned long long value = strtoull(text, &end, 10);
  if (end == text) return 0;
  unsigned long long scale = 1;
  switch (*end) {
    case 'k':
    case 'K':
      scale = 1ULL << 10;
      ++end;
      break;
    case 'm':
    case 'M':
      scale = 1ULL << 20;
      ++end;
      break;
    case 'g':
    case 'G':
      scale = 1ULL << 30;
      ++end;
      break;
    default:
      break;
  }
  if (scale > 1 && *end == 'i') ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0' || value > SIZE_MAX / scale) return 0;
  *out = (size_t)(value * scale);
  return 1;
}

static int parse_ops(const char* list, Options* options) {
  options->op_count = 0;
  for (const char* name = list;; ++name) {
    const size_t length = strcspn(name, ",");
    int found = -1;
    for (int op = 0; op < OP_COUNT; ++op)
      if (strlen(op_names[op]) == length && strncmp(name, op_names[op], length) == 0) found = op;
    if (found < 0 || options->op_count == OP_COUNT) return 0;
    options->ops[options->op_count++] = found;
    name += length;
    if (*name == '\0') return 1;
  }
}

/* Every rank parses the same arguments; only rank 0 (`loud`) says what is wrong. */
static int parse_options(int argc, char** argv, int loud, Options* options) {
  options->op_count = OP_COUNT;
  for (int op = 0; op < OP_COUNT; ++op) options->ops[op] = op;
  options->min_bytes = 8;
  options->max_bytes = 64u << 20;
  options->iters = 0;
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    if (strcmp(flag, "--help") == 0) return 0;
    if (i + 1 >= argc) {
      if (loud) fprintf(stderr, "braid-bench-mpi-peer: %s needs a value\n", flag);
      return 0;
    }
    const char* value = argv[++i];
    int ok = 0;
    if (strcmp(flag, "--ops") == 0)
      ok = parse_ops(value, options);
    else if (strcmp(flag, "--min-bytes") == 0)
      ok = parse_bytes(value, &options->min_bytes);
    else if (strcmp(flag, "--max-bytes") == 0)
      ok = parse_bytes(value, &options->max_bytes);
    else if (strcmp(flag, "--iters") == 0) {
      char* end = NULL;
      long iters = strtol(value, &end, 10);
      ok = *end == '\0' && iters > 0 && iters <= INT_MAX;
      options->iters = (int)iters;
    }
    if (!ok) {
      if (loud) fprintf(stderr, "braid-bench-mpi-peer: bad option %s %s\n", flag, value);
      return 0;
    }
  }
  if (options->min_bytes == 0 || options->min_bytes > options->max_bytes) {
    if (loud) fprintf(stderr, "braid-bench-mpi-peer: need 0 < --min-bytes <= --max-bytes\n");
    return 0;
  }
  return 1;
}

/* Ops that cut the buffer into one block per rank; busbw counts the (P-1)/P that crosses. */
static int splits_across_ranks(int op) {
  return op != ALL_REDUCE && op != BROADCAST && op != REDUCE && op != BARRIER;
}

static double bus_factor(int op, int ranks) {
  if (op == ALL_REDUCE) return 2.0 * (ranks - 1) / ranks;
  if (splits_across_ranks(op)) return (double)(ranks - 1) / ranks;
  return 1.0;
}

/* Part j of `total` elements cut into P uneven parts, as braid-bench cuts them: weight
 * ((j + shift) % P) + 1 of P(P+1)/2, rounded down, the last part taking the remainder.
 * all_gather_v: rank r contributes part r (shift 0); all_to_all_v: rank s sends part d of
 * its input to rank d (shift s). */
static size_t uneven_part(size_t total, int ranks, int shift, int j) {
  const size_t p = (size_t)ranks, weights = p * (p + 1) / 2;
  if (j < ranks - 1) return total * (((size_t)j + (size_t)shift) % p + 1) / weights;
  size_t given = 0;
  for (int i = 0; i < ranks - 1; ++i) given += uneven_part(total, ranks, shift, i);
  return total - given;
}

/* Where part j starts: the sum of the parts before it. */
static size_t uneven_offset(size_t total, int ranks, int shift, int j) {
  size_t offset = 0;
  for (int i = 0; i < j; ++i) offset += uneven_part(total, ranks, shift, i);
  return offset;
}

static void run_once(int op, const Buffers* b) {
  const int count = (int)b->count, block = (int)b->block;
  switch (op) {
    case ALL_REDUCE:
      MPI_Allreduce(b->send, b->recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case ALL_GATHER:
      MPI_Allgather(b->send, block, MPI_FLOAT, b->recv, block, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case REDUCE_SCATTER:
      MPI_Reduce_scatter_block(b->send, b->recv, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case BROADCAST:
      MPI_Bcast(b->recv, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case REDUCE:
      MPI_Reduce(b->send, b->recv, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
      break;
    case GATHER:
      MPI_Gather(b->send, block, MPI_FLOAT, b->recv, block, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case SCATTER:
      MPI_Scatter(b->send, block, MPI_FLOAT, b->recv, block, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case ALL_TO_ALL:
      MPI_Alltoall(b->send, block, MPI_FLOAT, b->recv, block, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case ALL_GATHER_V:
      MPI_Allgatherv(b->send, b->send_counts[0], MPI_FLOAT, b->recv, b->recv_counts, b->recv_displs,
                     MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case ALL_TO_ALL_V:
      MPI_Alltoallv(b->send, b->send_counts, b->send_displs, MPI_FLOAT, b->recv, b->recv_counts,
                    b->recv_displs, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case BARRIER:
      MPI_Barrier(MPI_COMM_WORLD);
      break;
    default:
      break;
  }
}

/* Element counts of the two buffers, as each MPI call reads and writes them. The root's
 * buffer of gather and scatter is `count` elements; the others' is unused. */
static size_t send_elements(int op, const Buffers* b, int rank) {
  switch (op) {
    case ALL_GATHER:
    case GATHER:
      return b->block;
    case ALL_GATHER_V:
      return (size_t)b->send_counts[0];
    case SCATTER:
      return rank == 0 ? b->count : 0;
    case BROADCAST:
    case BARRIER:
      return 0;
    default:
      return b->count;
  }
}

static size_t recv_elements(int op, const Buffers* b, int rank, int ranks) {
  switch (op) {
    case REDUCE_SCATTER:
    case SCATTER:
      return b->block;
    case GATHER:
      return rank == 0 ? b->count : 0;
    case ALL_TO_ALL_V:
      return (size_t)b->recv_displs[ranks - 1] + (size_t)b->recv_counts[ranks - 1];
    case BARRIER:
      return 0;
    default:
      return b->count;
  }
}

/* The counts and displacements of the variable-count ops (NULL for the others). */
static void plan_counts(int op, Buffers* b, int rank, int ranks) {
  if (op != ALL_GATHER_V && op != ALL_TO_ALL_V) return;
  const size_t n = (size_t)ranks;
  b->send_counts = calloc(n, sizeof(int));
  b->send_displs = calloc(n, sizeof(int));
  b->recv_counts = calloc(n, sizeof(int));
  b->recv_displs = calloc(n, sizeof(int));
  if (!b->send_counts || !b->send_displs || !b->recv_counts || !b->recv_displs) {
    fprintf(stderr, "braid-bench-mpi-peer: rank %d cannot allocate counts\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int at = 0;
  for (int j = 0; j < ranks; ++j) {
    if (op == ALL_GATHER_V) {
      b->recv_counts[j] = (int)uneven_part(b->count, ranks, 0, j);
    } else {
      b->send_counts[j] = (int)uneven_part(b->count, ranks, rank, j);
      b->send_displs[j] = (int)uneven_offset(b->count, ranks, rank, j);
      b->recv_counts[j] = (int)uneven_part(b->count, ranks, j, rank);
    }
    b->recv_displs[j] = at;
    at += b->recv_counts[j];
  }
  if (op == ALL_GATHER_V) b->send_counts[0] = b->recv_counts[rank];
}

static void free_buffers(Buffers* b) {
  free(b->send);
  free(b->recv);
  free(b->send_counts);
  free(b->send_displs);
  free(b->recv_counts);
  free(b->recv_displs);
}

static void fill_inputs(int op, const Buffers* b, int rank) {
  for (size_t i = 0; i < send_elements(op, b, rank); ++i) b->send[i] = input_value(rank, i);
  if (op == BROADCAST && rank == 0)
    for (size_t i = 0; i < b->count; ++i) b->recv[i] = input_value(0, i);
}

static void clear_outputs(int op, const Buffers* b, int rank, int ranks) {
  if (op == BROADCAST && rank == 0) return; /* the root's buffer is its input */
  for (size_t i = 0; i < recv_elements(op, b, rank, ranks); ++i) b->recv[i] = sentinel;
}

/* Part s of the output came from rank s: all_gather_v, its whole input; all_to_all_v, the
 * piece of its input it cut for this rank. Checked part by part, so where each part's
 * values start is worked out once per part, not per element. */
static long long count_wrong_variable(int op, const Buffers* b, int rank, int ranks) {
  long long wrong = 0;
  for (int source = 0; source < ranks; ++source) {
    const size_t first = op == ALL_GATHER_V ? 0 : uneven_offset(b->count, ranks, source, rank);
    const float* part = b->recv + b->recv_displs[source];
    for (size_t k = 0; k < (size_t)b->recv_counts[source]; ++k)
      wrong += part[k] != input_value(source, first + k);
  }
  return wrong;
}

static float expected_value(int op, const Buffers* b, int rank, int ranks, size_t i) {
  switch (op) {
    case ALL_REDUCE:
    case REDUCE:
      return reduced_value(ranks, i);
    case ALL_GATHER:
    case GATHER:
      return input_value((int)(i / b->block), i % b->block);
    case REDUCE_SCATTER:
      return reduced_value(ranks, (size_t)rank * b->block + i);
    case BROADCAST:
      return input_value(0, i);
    case SCATTER:
      return input_value(0, (size_t)rank * b->block + i);
    /* block s came from rank s, which sent its elements [rank*block, (rank+1)*block) here */
    case ALL_TO_ALL:
      return input_value((int)(i / b->block), (size_t)rank * b->block + i % b->block);
    default:
      return 0.0f;
  }
}

static long long count_wrong(int op, const Buffers* b, int rank, int ranks) {
  if (op == BARRIER || ((op == REDUCE || op == GATHER) && rank != 0)) return 0;
  if (op == ALL_GATHER_V || op == ALL_TO_ALL_V) return count_wrong_variable(op, b, rank, ranks);
  long long wrong = 0;
  for (size_t i = 0; i < recv_elements(op, b, rank, ranks); ++i)
    wrong += b->recv[i] != expected_value(op, b, rank, ranks, i);
  return wrong;
}

/* The slowest rank's seconds, on rank 0 (0 elsewhere). */
static double max_over_ranks(double seconds) {
  double slowest = 0.0;
  MPI_Reduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  return slowest;
}

/* Runs the warm-up; without --iters, rank 0 sizes the timed loop from the slowest rank's
 * last two warm-up calls (the first pays for page faults) and every rank takes its count. */
static int warm_up(int op, const Buffers* b, const Options* options, int rank) {
  run_once(op, b);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 1; i < WARMUP_ITERS; ++i) run_once(op, b);
  const double per_call = max_over_ranks(MPI_Wtime() - start) / (WARMUP_ITERS - 1);
  if (options->iters > 0) return options->iters;
  int iters = MAX_ITERS;
  if (rank == 0 && per_call * MAX_ITERS > target_seconds) {
    iters = (int)(target_seconds / per_call);
    if (iters < MIN_ITERS) iters = MIN_ITERS;
  }
  MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return iters;
}

static void measure(int op, size_t bytes, int rank, int ranks, const Options* options) {
  Buffers b = {NULL, NULL, bytes / sizeof(float), bytes / sizeof(float) / (size_t)ranks, NULL, NULL,
               NULL, NULL};
  plan_counts(op, &b, rank, ranks);
  if (bytes > 0) {
    b.send = malloc(send_elements(op, &b, rank) * sizeof(float) + 1);
    b.recv = malloc(recv_elements(op, &b, rank, ranks) * sizeof(float) + 1);
    if (b.send == NULL || b.recv == NULL) {
      fprintf(stderr, "braid-bench-mpi-peer: rank %d cannot allocate %zu bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  fill_inputs(op, &b, rank);
  clear_outputs(op, &b, rank, ranks);

  const int iters = warm_up(op, &b, options, rank);
  /* A tenth of the loop again, untimed (~20 ms), as braid does: the processes settle. */
  for (int i = 0; i < (iters / 10 > 10 ? iters / 10 : 10); ++i) run_once(op, &b);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i) run_once(op, &b);
  const double slowest = max_over_ranks(MPI_Wtime() - start);

  /* One more call on cleared outputs, so a result left by an earlier call cannot pass. */
  clear_outputs(op, &b, rank, ranks);
  run_once(op, &b);
  const long long wrong_here = count_wrong(op, &b, rank, ranks);
  long long wrong = 0;
  MPI_Reduce(&wrong_here, &wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  free_buffers(&b);

  if (rank != 0) return;
  const double time_us = slowest / iters * 1e6;
  const double algbw = bytes == 0 ? 0.0 : (double)bytes / time_us / 1e3; /* GB/s, 1e9 bytes */
  printf(
      "{\"peer\":\"openmpi\",\"op\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"count\":%zu,"
      "\"dtype\":\"f32\",\"iters\":%d,\"time_us\":%.3f,\"algbw_gbps\":%.6g,"
      "\"busbw_gbps\":%.6g,\"wrong\":%lld}\n",
      op_names[op], ranks, bytes, b.count, iters, time_us, algbw, algbw * bus_factor(op, ranks),
      wrong);
  fflush(stdout);
}

/* Sizes double from --min-bytes to --max-bytes. Ops that split the buffer across ranks
 * round it down to whole f32 elements per rank and skip it when a rank would get none;
 * the others need one element. Barrier runs once, with no buffer. */
static void measure_op(int op, int rank, int ranks, const Options* options) {
  if (op == BARRIER) {
    measure(op, 0, rank, ranks, options);
    return;
  }
  const size_t granule = sizeof(float) * (splits_across_ranks(op) ? (size_t)ranks : 1);
  for (size_t size = options->min_bytes; size <= options->max_bytes; size *= 2) {
    const size_t bytes = size / granule * granule;
    if (bytes > 0 && bytes / sizeof(float) <= INT_MAX) measure(op, bytes, rank, ranks, options);
    if (size > SIZE_MAX / 2) break;
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  Options options;
  if (!parse_options(argc, argv, rank == 0, &options)) {
    if (rank == 0)
      fprintf(stderr,
              "usage: braid-bench-mpi-peer [--ops all_reduce,all_gather,reduce_scatter,"
              "broadcast,reduce,gather,scatter,all_to_all,all_gather_v,all_to_all_v,barrier] "
              "[--min-bytes 8] [--max-bytes 64M] "
              "[--iters N]\n");
    MPI_Finalize();
    return 2;
  }
  for (int i = 0; i < options.op_count; ++i) measure_op(options.ops[i], rank, ranks, &options);
  MPI_Finalize();
  return 0;
}
