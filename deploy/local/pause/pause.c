/*
 * The pod sandbox ("pause") process of deploy/local/node.sh's one-node cluster.
 *
 * No registry is reachable, so containerd cannot pull the usual pause image: this is built
 * with `gcc -static` and packaged alone in an image from scratch. It holds the pod's
 * namespaces open, reaps the zombies of a pod that shares its PID namespace, and exits
 * cleanly on SIGINT/SIGTERM so that a sandbox stops at once instead of after a timeout.
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigemptyset(&stop.sa_mask);
  sigemptyset(&child.sa_mask);
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
