/*
 * toolpool's session sandbox holder and command spawner (SPEC V1-V5).
 *
 * bubblewrap starts this program once per session, as the sandbox's pid 1, from a
 * descriptor of the host's file (it never comes from the sandbox's root):
 *
 *   spawner LISTEN_FD SECCOMP_FD READY_FD LIFELINE_FD
 *
 * LISTEN_FD   a listening SOCK_SEQPACKET unix socket, bound on the host where the
 *             sandbox cannot see it; one connection per command.
 * SECCOMP_FD  the command seccomp program (BPF), or -1; applied to commands only,
 *             because this program itself needs clone, unshare and mount.
 * READY_FD    one byte "1" is written there once requests are served.
 * LIFELINE_FD the read end of a pipe the host side holds: when it closes (the
 *             session closed, or its process died) this program exits, and the
 *             kernel ends every process of the sandbox with its pid 1.
 *
 * Per connection, a per-command init is cloned in a new PID and mount namespace.
 * It reads the request, joins the call's cgroups (before anything else exists),
 * mounts a /proc of its own namespace, and forks the command: setsid, the fds,
 * rlimits, cwd, no capability, no_new_privs, seccomp, execve.
 *
 * Request (client to init): one message of struct header with SCM_RIGHTS fds
 * (stdin, stdout, stderr, n_cgroups cgroup.procs fds, n_extra fds that become fd 3,
 * 4, ...), then payload_len bytes in further messages: n_rlimits struct wire_rlimit,
 * then NUL-terminated strings: cwd, n_argv argv strings, n_env "NAME=value" strings.
 * flags: FLAG_IGNORE_SIGXFSZ, the command starts with SIGXFSZ ignored (a write past
 * RLIMIT_FSIZE then fails with EFBIG instead of killing it); no other bit is known.
 * Replies (init to client): "R" ready (the command was exec'd), "F<why>" it failed
 * before the command (an "X" with exit status 127 follows), "X<int32 wait status>"
 * the command ended. The client's receiving socket has SO_PASSCRED: each reply
 * carries the init's pid as the client sees it.
 * Requests (client to init): "S<int32 signal>" signal every process of the command
 * (kill(-1) in its namespace); "K", or closing the connection: end the namespace.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAGIC 0x31535054u /* "TPS1", little-endian */
#define MAX_CGROUPS 16
#define MAX_EXTRA 32
#define MAX_RLIMITS 64
#define MAX_PAYLOAD (8u << 20)
#define MAX_FDS (3 + MAX_CGROUPS + MAX_EXTRA)
#define MAX_FILTER (1u << 20)
#define FLAG_IGNORE_SIGXFSZ 1u

struct header {
    uint32_t magic, n_cgroups, n_extra, n_argv, n_env, n_rlimits, flags, payload_len;
};

struct wire_rlimit {
    uint32_t resource, pad;
    uint64_t soft, hard;
};

/* A parsed request; strings point into payload. */
struct request {
    struct header h;
    int fds[MAX_FDS];
    int n_fds;
    char *payload;
    struct wire_rlimit *rlimits;
    const char *cwd;
    char **argv;
    char **envp;
};

static struct sock_fprog filter; /* the command seccomp program; len 0: none */

/* Send one reply; errors are ignored (the client may be gone, which ends us). */
static void reply(int conn, char kind, const void *data, size_t len) {
    char buf[1024];
    if (len > sizeof buf - 1) len = sizeof buf - 1;
    buf[0] = kind;
    if (len) memcpy(buf + 1, data, len);
    (void)send(conn, buf, len + 1, MSG_NOSIGNAL);
}

/* Report a failure before the command: "F<why>", then exit status 127. */
static void fail(int conn, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof why) n = sizeof why - 1;
    reply(conn, 'F', why, (size_t)n);
    int32_t status = 127 << 8;
    reply(conn, 'X', &status, sizeof status);
    _exit(1);
}

/* Close every fd from `low` up, but those in keep[]. */
static int close_others(int low, const int *keep, int n) {
    int sorted[MAX_FDS + 8];
    if (n > (int)(sizeof sorted / sizeof sorted[0])) return -1;
    memcpy(sorted, keep, (size_t)n * sizeof(int));
    for (int i = 1; i < n; i++) /* insertion sort: a handful of fds */
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    int from = low;
    for (int i = 0; i < n; i++) {
        if (sorted[i] < from) continue;
        if (sorted[i] > from && syscall(SYS_close_range, from, sorted[i] - 1, 0) < 0) return -1;
        from = sorted[i] + 1;
    }
    return (int)syscall(SYS_close_range, from, ~0U, 0);
}

/* Read the whole seccomp program from fd into `filter`. */
static int load_filter(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0) return -1;
    if (st.st_size <= 0 || (size_t)st.st_size > MAX_FILTER ||
        st.st_size % (off_t)sizeof(struct sock_filter) != 0) {
        errno = EINVAL;
        return -1;
    }
    struct sock_filter *prog = malloc((size_t)st.st_size);
    if (prog == NULL) return -1;
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = pread(fd, (char *)prog + got, (size_t)st.st_size - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;
            free(prog);
            return -1;
        }
        got += (size_t)n;
    }
    filter.len = (unsigned short)((size_t)st.st_size / sizeof(struct sock_filter));
    filter.filter = prog;
    return 0;
}

/* Receive the request's first message and its fds. */
static void receive_header(int conn, struct request *r) {
    union {
        char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = &r->h, .iov_len = sizeof r->h};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control.buf, .msg_controllen = sizeof control.buf};
    ssize_t n;
    do n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n == 0) _exit(0); /* the client left */
    if (n < 0) fail(conn, "cannot read the request: %s", strerror(errno));
    r->n_fds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count && r->n_fds < MAX_FDS; i++)
            memcpy(&r->fds[r->n_fds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    if ((size_t)n != sizeof r->h || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        fail(conn, "malformed request header");
    struct header *h = &r->h;
    if (h->magic != MAGIC || (h->flags & ~FLAG_IGNORE_SIGXFSZ) || h->n_cgroups > MAX_CGROUPS ||
        h->n_extra > MAX_EXTRA || h->n_rlimits > MAX_RLIMITS || h->n_argv < 1 ||
        h->payload_len > MAX_PAYLOAD)
        fail(conn, "malformed request header");
    if (r->n_fds != (int)(3 + h->n_cgroups + h->n_extra))
        fail(conn, "request carries %d fds, expected %u", r->n_fds,
             3 + h->n_cgroups + h->n_extra);
}

/* Receive the payload and point argv, envp, cwd and rlimits into it. */
static void receive_payload(int conn, struct request *r) {
    size_t len = r->h.payload_len, got = 0;
    r->payload = malloc(len + 1);
    if (r->payload == NULL) fail(conn, "out of memory");
    while (got < len) {
        ssize_t n = recv(conn, r->payload + got, len - got, MSG_TRUNC);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) _exit(0);
        if (n < 0) fail(conn, "cannot read the request: %s", strerror(errno));
        if ((size_t)n > len - got) fail(conn, "request longer than announced");
        got += (size_t)n;
    }
    size_t limits = (size_t)r->h.n_rlimits * sizeof(struct wire_rlimit);
    if (len < limits) fail(conn, "malformed request payload");
    r->rlimits = malloc(limits + 1);
    if (r->rlimits == NULL) fail(conn, "out of memory");
    memcpy(r->rlimits, r->payload, limits);
    size_t want = 1 + (size_t)r->h.n_argv + r->h.n_env;
    char **strings = calloc(want + 2, sizeof(char *));
    if (strings == NULL) fail(conn, "out of memory");
    size_t count = 0, at = limits;
    while (at < len) {
        char *end = memchr(r->payload + at, '\0', len - at);
        if (end == NULL || count == want) fail(conn, "malformed request payload");
        strings[count++] = r->payload + at;
        at = (size_t)(end - r->payload) + 1;
    }
    if (count != want) fail(conn, "malformed request payload");
    /* cwd, argv..., NULL, envp..., NULL: shift envp one slot for argv's NULL. */
    memmove(strings + 2 + r->h.n_argv, strings + 1 + r->h.n_argv, r->h.n_env * sizeof(char *));
    strings[1 + r->h.n_argv] = NULL;
    strings[2 + r->h.n_argv + r->h.n_env] = NULL;
    r->cwd = strings[0];
    r->argv = strings + 1;
    r->envp = strings + 2 + r->h.n_argv;
}

/* In the command's process: report why it cannot be started, then exit 127. */
static void die(int errpipe, const char *what, const char *arg) {
    char why[512];
    int n = snprintf(why, sizeof why, "%s%s%s: %s", what, arg ? " " : "", arg ? arg : "",
                     strerror(errno));
    if (n > 0) (void)!write(errpipe, why, (size_t)n < sizeof why ? (size_t)n : sizeof why - 1);
    _exit(127);
}

/* execve argv[0], searched on the PATH of envp (as subprocess does), never sh. */
static void exec_search(char **argv, char **envp, int errpipe) {
    if (strchr(argv[0], '/') != NULL) {
        execve(argv[0], argv, envp);
        die(errpipe, "cannot execute", argv[0]);
    }
    const char *path = "/bin:/usr/bin";
    for (char **e = envp; *e != NULL; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    int saved = ENOENT;
    char full[4096];
    for (const char *p = path;; p++) {
        const char *colon = strchrnul(p, ':');
        size_t dir = (size_t)(colon - p);
        int n = snprintf(full, sizeof full, "%.*s%s%s", (int)dir, p, dir ? "/" : "", argv[0]);
        if (n > 0 && (size_t)n < sizeof full) {
            execve(full, argv, envp);
            if (errno != ENOENT && errno != ENOTDIR) saved = errno;
        }
        if (*colon == '\0') break;
        p = colon;
    }
    errno = saved;
    die(errpipe, "cannot execute", argv[0]);
}

/* The command's process, forked by the init: every layer, then execve. */
static void start_command(struct request *r, int errpipe) {
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0) die(errpipe, "sigprocmask", NULL);
    if ((r->h.flags & FLAG_IGNORE_SIGXFSZ) && signal(SIGXFSZ, SIG_IGN) == SIG_ERR)
        die(errpipe, "signal", NULL); /* ignored stays ignored through execve */
    if (setsid() < 0) die(errpipe, "setsid", NULL);
    /* fds: stdin, stdout, stderr, then the extra ones as 3, 4, ... */
    int n_target = 3 + (int)r->h.n_extra, src[3 + MAX_EXTRA];
    for (int i = 0; i < n_target; i++) {
        int from = i < 3 ? r->fds[i] : r->fds[3 + r->h.n_cgroups + (unsigned)(i - 3)];
        src[i] = fcntl(from, F_DUPFD_CLOEXEC, n_target + 1);
        if (src[i] < 0) die(errpipe, "dup", NULL);
    }
    int err = fcntl(errpipe, F_DUPFD_CLOEXEC, n_target + 1);
    if (err < 0) die(errpipe, "dup", NULL);
    errpipe = err;
    for (int i = 0; i < n_target; i++)
        if (dup2(src[i], i) < 0) die(errpipe, "dup2", NULL);
    if (dup3(errpipe, n_target, O_CLOEXEC) < 0) die(errpipe, "dup3", NULL);
    errpipe = n_target;
    if (syscall(SYS_close_range, n_target + 1, ~0U, 0) < 0) die(errpipe, "close_range", NULL);
    for (uint32_t i = 0; i < r->h.n_rlimits; i++) {
        struct rlimit lim = {.rlim_cur = r->rlimits[i].soft, .rlim_max = r->rlimits[i].hard};
        if (setrlimit((__rlimit_resource_t)r->rlimits[i].resource, &lim) < 0)
            die(errpipe, "setrlimit", NULL);
    }
    if (chdir(r->cwd) < 0) die(errpipe, "cannot enter", r->cwd);
    /* No capability, for good: bounding and ambient sets, securebits, then the rest. */
    for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) die(errpipe, "PR_CAPBSET_DROP", NULL);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        die(errpipe, "PR_CAP_AMBIENT", NULL);
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                         SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
                         SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) < 0) die(errpipe, "PR_SET_SECUREBITS", NULL);
    struct __user_cap_header_struct caphdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct capdata[2];
    memset(capdata, 0, sizeof capdata);
    if (syscall(SYS_capset, &caphdr, capdata) < 0) die(errpipe, "capset", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die(errpipe, "PR_SET_NO_NEW_PRIVS", NULL);
    if (filter.len && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter, 0, 0) < 0)
        die(errpipe, "seccomp", NULL);
    exec_search(r->argv, r->envp, errpipe);
}

/* Read what the command's process said before exec (nothing: it was exec'd). */
static void finish_errpipe(int conn, int *errpipe) {
    char why[512];
    size_t got = 0;
    for (;;) {
        ssize_t n = read(*errpipe, why + got, sizeof why - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || (got += (size_t)n) == sizeof why) break;
    }
    if (got == 0) reply(conn, 'R', NULL, 0);
    else reply(conn, 'F', why, got);
    close(*errpipe);
    *errpipe = -1;
}

/* The per-command init: pid 1 of the command's PID namespace. Never returns. */
static void command_init(int conn) {
    struct request r;
    memset(&r, 0, sizeof r);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) fail(conn, "PR_SET_PDEATHSIG");
    receive_header(conn, &r);
    /* The call's cgroups first: everything the command starts is counted there. */
    for (uint32_t i = 0; i < r.h.n_cgroups; i++) {
        int fd = r.fds[3 + i];
        if (write(fd, "0", 1) != 1) fail(conn, "cannot join cgroup %u: %s", i, strerror(errno));
        close(fd);
    }
    receive_payload(conn, &r);
    /* A /proc of this namespace only: the command sees its own processes. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        fail(conn, "cannot make the mounts private: %s", strerror(errno));
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        fail(conn, "cannot mount /proc: %s", strerror(errno));
    /* No user namespace below the sandbox's, even without the seccomp filter (X5). */
    int userns = open("/proc/sys/user/max_user_namespaces", O_WRONLY | O_CLOEXEC);
    if (userns < 0 || write(userns, "0", 1) != 1)
        fail(conn, "cannot forbid user namespaces: %s", strerror(errno));
    close(userns);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    int pipefd[2];
    if (sfd < 0 || pipe2(pipefd, O_CLOEXEC) < 0) fail(conn, "init: %s", strerror(errno));
    pid_t command = fork();
    if (command < 0) fail(conn, "cannot fork the command: %s", strerror(errno));
    if (command == 0) {
        close(pipefd[0]);
        start_command(&r, pipefd[1]);
    }
    close(pipefd[1]);
    for (int i = 0; i < r.n_fds; i++)
        if (i < 3 || i >= 3 + (int)r.h.n_cgroups) close(r.fds[i]);
    int errpipe = pipefd[0];
    for (;;) {
        struct pollfd p[3] = {{conn, POLLIN, 0}, {sfd, POLLIN, 0}, {errpipe, POLLIN, 0}};
        if (poll(p, errpipe >= 0 ? 3 : 2, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(1);
        }
        if (errpipe >= 0 && p[2].revents) finish_errpipe(conn, &errpipe);
        if (p[0].revents) {
            char msg[8];
            ssize_t n = recv(conn, msg, sizeof msg, MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n <= 0 || msg[0] == 'K') _exit(0); /* the kernel ends the namespace */
            int32_t sig;
            if (msg[0] == 'S' && n == 1 + (ssize_t)sizeof sig) {
                memcpy(&sig, msg + 1, sizeof sig);
                (void)kill(-1, sig);
            }
        }
        if (p[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) continue;
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
                if (pid != command) continue; /* an orphan of the command, reaped */
                if (errpipe >= 0) finish_errpipe(conn, &errpipe);
                int32_t s = status;
                reply(conn, 'X', &s, sizeof s);
            }
        }
    }
}

static int parse_fd(const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < -1 || v > 1 << 20) {
        fprintf(stderr, "toolpool spawner: bad fd %s\n", s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: spawner LISTEN_FD SECCOMP_FD READY_FD LIFELINE_FD\n");
        return 2;
    }
    int listen_fd = parse_fd(argv[1]), seccomp_fd = parse_fd(argv[2]);
    int ready_fd = parse_fd(argv[3]), lifeline = parse_fd(argv[4]);
    /* Same uid as the commands: no ptrace, no /proc/<pid>/fd of ours for them. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
        perror("toolpool spawner: PR_SET_DUMPABLE");
        return 1;
    }
    if (seccomp_fd >= 0 && load_filter(seccomp_fd) < 0) {
        perror("toolpool spawner: the seccomp program");
        return 1;
    }
    int keep[] = {listen_fd, ready_fd, lifeline};
    if (close_others(3, keep, 3) < 0) {
        perror("toolpool spawner: close_range");
        return 1;
    }
    if (fcntl(listen_fd, F_SETFD, FD_CLOEXEC) < 0 || fcntl(lifeline, F_SETFD, FD_CLOEXEC) < 0) {
        perror("toolpool spawner: fcntl");
        return 1;
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = -1;
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0 ||
        (sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
        perror("toolpool spawner: signalfd");
        return 1;
    }
    if (write(ready_fd, "1", 1) != 1) return 1;
    close(ready_fd);
    for (;;) {
        struct pollfd p[3] = {{listen_fd, POLLIN, 0}, {sfd, POLLIN, 0}, {lifeline, POLLIN, 0}};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        if (p[2].revents) return 0; /* the host side let go: the sandbox ends */
        if (p[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) continue;
            while (waitpid(-1, NULL, WNOHANG) > 0) continue;
        }
        if (!(p[0].revents & POLLIN)) continue;
        int conn = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) continue; /* EINTR, ECONNABORTED, or out of fds for now */
        /* fork semantics (no stack given) into a new PID and mount namespace. */
        long pid = syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, NULL, NULL, NULL, 0);
        if (pid == 0) {
            close(listen_fd);
            close(lifeline);
            close(sfd);
            command_init(conn);
        }
        if (pid < 0) {
            char why[256];
            int n = snprintf(why, sizeof why, "cannot clone the command's init: %s",
                             strerror(errno));
            reply(conn, 'F', why, n > 0 ? (size_t)n : 0);
            int32_t status = 127 << 8;
            reply(conn, 'X', &status, sizeof status);
        }
        close(conn);
    }
}
