// How the braid-runs of a job agree on its generations: each start of the job's ranks is a
// generation, and every launcher (one per node) starts, stops and restarts its ranks with
// the others through the store node 0's braid-run serves for the whole job. The store no
// longer lives in rank 0, so it survives every rank: a restart finds it where it was.
//
// Keys, in the root of that store:
//
//   braid/run/g/<g>/            the ranks' own keys in generation g (BRAID_STORE_PREFIX),
//                               so nothing of an earlier start (rank claims, wills, events)
//                               is seen by a later one
//   braid/run/g/<g>/node/<i>    "<host>:<pid>" of the braid-run that runs node i's ranks in
//                               g; a braid-run that finds another's there is the node's
//                               replacement, and ends g
//   braid/run/g/<g>/joined      under --nnodes MIN:MAX, a log of the nodes that claimed their
//                               place in g, in the order they did
//   braid/run/g/<g>/members     under MIN:MAX, the nodes that run g ("0,2"), set once by
//                               compare_set when the count closes; a node not in it ends g to
//                               take part in g+1
//   braid/run/g/<g>/end         how g ended, set once by compare_set (the first launcher to
//                               end it wins; a launcher's will ends it if its connection
//                               drops): R<why> restart after a failure, G<why> restart to
//                               take in a node (not counted against --max-restarts),
//                               F<status>:<why> the job failed, D the job is done; every
//                               launcher waits on it
//   braid/run/g/<g>/finished    a counter: launchers whose ranks all exited with 0 in g; the
//                               last of the job's nodes ends g with D
//   braid/run/g/<g>/read        a counter: launchers that have read g's end, so node 0 stops
//                               serving only once the others know
//   braid/run/failures          a log (StoreClient::append) of every failure, named
//
// A generation ends in a restart while failures have cost fewer than --max-restarts restarts:
// the limit is the job's, not each node's (torchrun's agents count theirs apart). One round
// trip ends a generation, and every launcher learns of it from its pending get at once.
//
// What node 0's loss costs: the store goes with it, every other launcher stops its ranks
// and exits naming it -- unless the store is an etcd cluster (--store etcd://...): then
// nobody serves it, every launcher is a client alike, and node 0 is replaced like any
// other. Each run then needs a name of its own there: a launcher that finds the named
// run already over says so and starts nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace braid::launcher {

struct GenerationEnd {
  enum class Kind { restart, failed, done, store_lost };
  Kind kind = Kind::done;
  int status = 0;     // failed, store_lost: braid-run's exit status
  std::string why;    // restart, failed, store_lost: what happened, for people
  bool ours = false;  // this launcher ended the generation (end_by_failure's own end stood)
  // restart: a failure's, counted against --max-restarts; false: a node came to take part
  // (--nnodes MIN:MAX), which costs none, as torchrun's membership changes do not.
  bool counted = true;
};

class Rendezvous {
 public:
  struct Options {
    std::string host;  // node 0's address (127.0.0.1 on one node)
    std::uint16_t port = 0;
    std::string token;
    bool serve = false;  // node 0: serve the store here, on a thread of braid-run's own
    // Not empty: the store is this etcd cluster (host, port, token and serve unused).
    std::vector<std::string> etcd_members;
    std::string etcd_namespace;
    int node_rank = 0;
    int nnodes = 1;      // the most nodes the job runs on (--nnodes N, or MAX of MIN:MAX)
    int min_nnodes = 1;  // the fewest it runs on (N, or MIN): below nnodes, membership is elastic
    // With min_nnodes < nnodes: how long a generation waits for more nodes once it has
    // min_nnodes.
    std::chrono::milliseconds join_wait{10000};
    int max_restarts = 0;
    int interrupt_fd = -1;  // readable (braid-run's signalfd): stop waiting for node 0
  };

  // Node 0 starts serving at once; every node connects, waiting for node 0 until
  // BRAID_TIMEOUT or until interrupt_fd is readable. std::runtime_error saying why where it
  // cannot (the port taken, a wrong BRAID_TOKEN, node 0 never answering, a signal).
  explicit Rendezvous(Options options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // The generation this node's ranks start in next, claimed for this node, and the end
  // watched (wakeup_fd). The first call joins the job's current generation, ending it
  // first when this braid-run replaces one that ran there (its node failed and was
  // started again); later calls follow a restart. nullopt when the job has already ended:
  // ended() says how.
  std::optional<std::int64_t> enter();

  // The port the store listens on (on node 0, the one it bound: Options::port 0 picks any).
  std::uint16_t port() const;
  // "node 0 (127.0.0.1:29500)", "etcd at h:p,h:p": where the store is, for messages.
  const std::string& where() const;
  // Whether enter() found the job over before this launcher took part in it (a run's name
  // used twice in an etcd store, or a replacement that came too late).
  bool found_ended() const;
  // Set where enter() returned nullopt because this node takes no part, not because the job
  // ended: why (too few nodes joined within BRAID_TIMEOUT, a signal).
  const std::optional<std::string>& not_joined() const;
  // The nodes (their --node-rank) that run the generation entered last, in order: a node's
  // place in the job (BRAID_NODE_RANK) is its index here, and the job's node count their
  // number. Every node under --nnodes N; under MIN:MAX, those that joined in time.
  const std::vector<int>& members() const;
  // The restarts failures had cost the job before the generation entered last.
  int restarts_used() const;

  // The ranks' BRAID_STORE_PREFIX for generation g.
  static std::string key_prefix(std::int64_t generation);

  // Readable (an eventfd) once the generation entered last has ended, or the store is lost;
  // clear_wakeup() reads it empty again.
  int wakeup_fd() const;
  void clear_wakeup();
  // How the generation entered last ended, once wakeup_fd() said so; nullopt before.
  std::optional<GenerationEnd> ended() const;

  // Ends the generation entered last because of `failure` on this node: a restart below
  // --max-restarts where `may_restart` (a rank failed; not braid-run told to stop, nor a
  // program that cannot be executed), else the job's failure with exit status `status`.
  // The failure goes to the job's log either way. Returns how it ended: this call's end, or
  // one another launcher set first.
  GenerationEnd end_by_failure(int status, const std::string& failure, bool may_restart);
  // This node's ranks all exited with 0: counted, and the last node ends the generation
  // as done. Returns at once; wakeup_fd() tells when the generation has ended.
  void finished();
  // Every failure the job's log holds, in order ("generation 0, node 1: rank 3 ...").
  std::vector<std::string> failures();
  // Counts this launcher as having read the end. On node 0, which serves the store, then
  // waits (a few seconds at most) until every launcher has, so none loses its answer.
  void leave();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid::launcher
