// A real etcd cluster for the store's tests: `etcd` (Debian's etcd-server, which tools/dev
// installs) started on loopback ports, its data in /dev/shm so that its fsyncs cost
// nothing, stopped and removed when the object goes. A client's connect waits for it to
// answer, so nothing here waits for it to come up.
#pragma once

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/transport/bootstrap.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::transport {

class EtcdTestCluster {
 public:
  explicit EtcdTestCluster(int members = 1) {
    if (::access("/usr/bin/etcd", X_OK) != 0) {
      throw std::runtime_error(
          "these tests need etcd: apt-get install etcd-server (tools/dev does)");
    }
    directory_ = fmt::format("/dev/shm/braid-etcd-test-{}-{}", ::getpid(), next_id()++);
    std::filesystem::remove_all(directory_);
    std::string initial;
    for (int m = 0; m < members; ++m) {
      ports_.push_back({find_free_port(), find_free_port()});
      initial += fmt::format("{}m{}=http://127.0.0.1:{}", m == 0 ? "" : ",", m, ports_[m].peer);
    }
    for (int m = 0; m < members; ++m) {
      const std::vector<std::string> argv{"/usr/bin/etcd",
                                          "--name",
                                          fmt::format("m{}", m),
                                          "--data-dir",
                                          fmt::format("{}/m{}", directory_, m),
                                          "--listen-client-urls",
                                          fmt::format("http://127.0.0.1:{}", ports_[m].client),
                                          "--advertise-client-urls",
                                          fmt::format("http://127.0.0.1:{}", ports_[m].client),
                                          "--listen-peer-urls",
                                          fmt::format("http://127.0.0.1:{}", ports_[m].peer),
                                          "--initial-advertise-peer-urls",
                                          fmt::format("http://127.0.0.1:{}", ports_[m].peer),
                                          "--initial-cluster",
                                          initial,
                                          "--initial-cluster-state",
                                          "new",
                                          "--log-level",
                                          "error",
                                          "--logger",
                                          "zap"};
      pids_.push_back(start(argv, fmt::format("{}/m{}.log", directory_, m)));
    }
  }
  ~EtcdTestCluster() {
    for (std::size_t m = 0; m < pids_.size(); ++m) stop_member(static_cast<int>(m));
    std::filesystem::remove_all(directory_);
  }
  EtcdTestCluster(const EtcdTestCluster&) = delete;
  EtcdTestCluster& operator=(const EtcdTestCluster&) = delete;

  // "127.0.0.1:<client port>" of each member.
  std::vector<std::string> members() const {
    std::vector<std::string> out;
    for (const Ports& p : ports_) out.push_back(fmt::format("127.0.0.1:{}", p.client));
    return out;
  }
  // A store address for this cluster with its keys under `key_namespace` ("test-3/").
  StoreAddress address(std::string key_namespace) const {
    StoreAddress address;
    address.etcd_members = members();
    address.etcd_namespace = std::move(key_namespace);
    return address;
  }
  std::string url(const std::string& name) const {
    return format_etcd_url({members(), name + "/"});
  }
  // Kills member `m` as a machine's loss would (SIGKILL), and reaps it.
  void stop_member(int m) {
    pid_t& pid = pids_.at(static_cast<std::size_t>(m));
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
  }

 private:
  struct Ports {
    std::uint16_t client;
    std::uint16_t peer;
  };
  static int& next_id() {
    static int id = 0;
    return id;
  }
  static pid_t start(const std::vector<std::string>& argv, const std::string& log) {
    std::filesystem::create_directories(std::filesystem::path(log).parent_path());
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      if (std::FILE* out = std::freopen(log.c_str(), "w", stdout)) ::dup2(::fileno(out), 2);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    return pid;
  }

  std::string directory_;
  std::vector<Ports> ports_;
  std::vector<pid_t> pids_;
};

}  // namespace braid::transport
