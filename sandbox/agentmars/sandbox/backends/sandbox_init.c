/* The sandbox init of agentmars' process backend: every process of a job that is not
 * the job's command. The backend (process.py, whose module docstring tells the whole
 * chain) builds it statically linked, so it needs no loader and reads no environment.
 *
 * sandbox-init host --parent PID --report FD --cpus LIST [--rlimit RESOURCE=VALUE]...
 *                   [--join FILE]... [--netns NSFD] -- PROGRAM ARG...
 *   The process the backend spawns. It dies with the backend (PID; if that is gone
 *   already, it exits), joins the slot's network namespace (open on NSFD, which it
 *   closes) and cgroups (writes 0 to each FILE), pins itself to the cores in LIST
 *   (comma-separated), sets each rlimit (soft = hard = VALUE), then execs PROGRAM
 *   (bubblewrap, or the command itself without it), looked up on PATH. Everything
 *   PROGRAM starts inherits all of that. If it cannot confine itself it writes one
 *   JSON line {"unconfined": "why"} on FD and exits with UNCONFINED, having run
 *   nothing. FD is closed on exec.
 *
 * sandbox-init pid1 [--drop ID] --cwd DIR [--env NAME=VALUE]... -- COMMAND ARG...
 *   The sandbox's pid 1 (bubblewrap --as-pid-1; the backend runs it from a descriptor,
 *   /proc/self/fd/N). It closes every descriptor but stdin, stdout and stderr, runs
 *   COMMAND as its child, reaps every process of the namespace until that child ends,
 *   then exits with its status (128+n for a death by signal n, as shells report it).
 *   The child drops to uid and gid ID with no groups and no capabilities at all (an
 *   empty bounding set) when --drop is given, then takes exactly the given environment
 *   (plus PWD), enters DIR and execs COMMAND, looked up on that environment's PATH.
 *
 * sandbox-init netns --send SOCKET
 *   Creates a network namespace for a slot's jobs to join (see netns.py): its loopback
 *   up, as bubblewrap's --unshare-net leaves it, and TCP TIME_WAIT off; sends a
 *   descriptor of it on the unix socket SOCKET (SCM_RIGHTS), and exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define UNCONFINED 125 /* host: the job could not be confined, nothing ran */
#define CANNOT_RUN 126 /* pid1: the command could not be started */
#define NOT_FOUND 127  /* pid1 or host: no such command (as shells report it) */
#define NO_NAMESPACE 1 /* netns: no namespace was sent */
#define USAGE 2
#define MAX_CPUS 8192 /* Linux's largest NR_CPUS */

static const char *const host_options[] = {"--parent", "--report", "--cpus", "--rlimit", "--join",
                                           "--netns", NULL};
static const char *const pid1_options[] = {"--drop", "--cwd", "--env", NULL};

static _Noreturn void fail(int status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("agentmars sandbox init: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    _exit(status);
}

static int is_one_of(const char *option, const char *const *options) {
    for (; *options != NULL; options++)
        if (strcmp(option, *options) == 0)
            return 1;
    return 0;
}

/* The index of the "--" that ends the options, which come as option/value pairs (so
 * a value may be "--" too); a command must follow it. */
static int end_of_options(int argc, char **argv, const char *const *options) {
    int i = 2;
    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2)
        if (i + 1 >= argc || !is_one_of(argv[i], options))
            fail(USAGE, "bad option %s", argv[i]);
    if (i + 1 >= argc)
        fail(USAGE, "no command after --");
    return i;
}

/* The value of a single-valued option, or NULL. */
static const char *option(char **argv, int end, const char *name) {
    const char *value = NULL;
    for (int i = 2; i < end; i += 2)
        if (strcmp(argv[i], name) == 0)
            value = argv[i + 1];
    return value;
}

static long number(const char *text, const char *what) {
    if (text == NULL)
        fail(USAGE, "no %s", what);
    char *rest;
    errno = 0;
    long value = strtol(text, &rest, 10);
    if (errno != 0 || rest == text || *rest != '\0' || value < 0)
        fail(USAGE, "bad %s: %s", what, text);
    return value;
}

/* --- host ------------------------------------------------------------------------ */

/* Reports on `report` why the job cannot be confined (errno says the cause), as one
 * line of JSON, and exits before anything of the job ran. */
static _Noreturn void unconfined(int report, const char *why, const char *what) {
    char message[512], line[2 * sizeof message + 32]; /* room to escape every byte */
    snprintf(message, sizeof message, "%s: %s: %s", why, what, strerror(errno));
    size_t n = (size_t)snprintf(line, sizeof line, "{\"unconfined\": \"");
    for (const char *c = message; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\')
            line[n++] = '\\';
        line[n++] = (unsigned char)*c < 0x20 ? ' ' : *c;
    }
    n += (size_t)snprintf(line + n, sizeof line - n, "\"}\n");
    ssize_t written = write(report, line, n); /* fails only if the backend is gone */
    (void)written;
    _exit(UNCONFINED);
}

/* SIGKILL when the backend (the thread that spawned us) ends; checked after it is
 * set, so a backend that ended before cannot leave the job running unwatched. */
static void die_with_backend(pid_t backend, int report) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        unconfined(report, "cannot confine the job", "PR_SET_PDEATHSIG");
    if (getppid() != backend)
        _exit(UNCONFINED);
}

/* The namespace stays the backend's: ours is closed, so PROGRAM does not hold it. */
static void join_netns(const char *fd_text, int report) {
    int fd = (int)number(fd_text, "--netns");
    if (setns(fd, CLONE_NEWNET) != 0)
        unconfined(report, "cannot join the slot's network namespace", fd_text);
    close(fd);
}

static void join_cgroup(const char *file, int report) {
    /* "0" is the writer itself; a v1 "tasks" file moves only the writing thread (the
     * only one here), without the lock that moving another process takes. */
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1)
        unconfined(report, "cannot join the slot's cgroups", file);
    close(fd);
}

static void pin_to_cores(const char *list, int report) {
    size_t size = CPU_ALLOC_SIZE(MAX_CPUS);
    cpu_set_t *set = CPU_ALLOC(MAX_CPUS);
    if (set == NULL)
        unconfined(report, "cannot confine the job: CPU affinity", list);
    CPU_ZERO_S(size, set);
    for (const char *core = list;; core++) {
        char *end;
        long number = strtol(core, &end, 10);
        if (end == core || number < 0 || number >= MAX_CPUS || (*end != ',' && *end != '\0'))
            fail(USAGE, "bad --cpus: %s", list);
        CPU_SET_S(number, size, set);
        if (*end == '\0')
            break;
        core = end; /* the comma, which the loop steps over */
    }
    if (sched_setaffinity(0, size, set) != 0)
        unconfined(report, "cannot confine the job: CPU affinity", list);
    CPU_FREE(set);
}

static void set_rlimit(const char *spec, int report) {
    char name[32];
    const char *equals = strchr(spec, '=');
    if (equals == NULL || (size_t)(equals - spec) >= sizeof name)
        fail(USAGE, "bad rlimit: %s", spec);
    snprintf(name, sizeof name, "%.*s", (int)(equals - spec), spec);
    rlim_t value = (rlim_t)number(equals + 1, "rlimit value");
    struct rlimit limit = {value, value};
    if (setrlimit((int)number(name, "rlimit resource"), &limit) != 0)
        unconfined(report, "cannot confine the job: rlimit", spec);
}

static int host(int argc, char **argv) {
    int end = end_of_options(argc, argv, host_options);
    int report = (int)number(option(argv, end, "--report"), "--report");
    const char *cores = option(argv, end, "--cpus");
    if (cores == NULL)
        fail(USAGE, "no --cpus");
    die_with_backend((pid_t)number(option(argv, end, "--parent"), "--parent"), report);
    const char *netns = option(argv, end, "--netns");
    if (netns != NULL)
        join_netns(netns, report);
    /* Joining a cpuset also sets the affinity to its cores: pin after it. */
    for (int i = 2; i < end; i += 2)
        if (strcmp(argv[i], "--join") == 0)
            join_cgroup(argv[i + 1], report);
    pin_to_cores(cores, report);
    for (int i = 2; i < end; i += 2)
        if (strcmp(argv[i], "--rlimit") == 0)
            set_rlimit(argv[i + 1], report);
    if (fcntl(report, F_SETFD, FD_CLOEXEC) != 0)
        unconfined(report, "cannot confine the job", "--report");
    execvp(argv[end + 1], argv + end + 1);
    fail(errno == ENOENT ? NOT_FOUND : CANNOT_RUN, "%s: %s", argv[end + 1], strerror(errno));
}

/* --- pid 1 ----------------------------------------------------------------------- */

/* The job starts with nothing ignored or blocked that the pool's process inherited
 * (Python ignores SIGPIPE, and its own parent may ignore more). */
static void reset_signals(void) {
    struct sigaction default_action = {.sa_handler = SIG_DFL};
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &default_action, NULL); /* fails for KILL, STOP, libc's own: fine */
}

/* What setpriv --reuid=ID --regid=ID --clear-groups --inh-caps=-all
 * --bounding-set=-all did: pid 1 keeps CAP_SETUID, CAP_SETGID and CAP_SETPCAP for
 * this, and nothing else. */
static void drop_privileges(const char *id_text) {
    uid_t id = (uid_t)number(id_text, "--drop");
    /* Emptying the bounding set needs CAP_SETPCAP, which the uid change takes. */
    for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
            fail(CANNOT_RUN, "cannot drop capability %d: %s", cap, strerror(errno));
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        fail(CANNOT_RUN, "cannot clear the ambient capabilities: %s", strerror(errno));
    if (setgroups(0, NULL) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0)
        fail(CANNOT_RUN, "cannot drop to uid %u: %s", id, strerror(errno));
    /* Leaving uid 0 empties the permitted and effective sets, not the inheritable. */
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {{0, 0, 0}};
    if (syscall(SYS_capset, &header, none) != 0)
        fail(CANNOT_RUN, "cannot clear the capabilities: %s", strerror(errno));
}

/* Exactly the given variables, and PWD (the directory the job starts in). */
static void set_environment(char **argv, int end, const char *cwd) {
    if (clearenv() != 0)
        fail(CANNOT_RUN, "cannot clear the environment");
    for (int i = 2; i < end; i += 2)
        if (strcmp(argv[i], "--env") == 0 && putenv(argv[i + 1]) != 0)
            fail(CANNOT_RUN, "cannot set %s", argv[i + 1]);
    if (setenv("PWD", cwd, 1) != 0)
        fail(CANNOT_RUN, "cannot set PWD");
}

static _Noreturn void run_command(char **argv, int end, const char *drop, const char *cwd) {
    reset_signals();
    /* Inherited from bubblewrap already; set here so the job never depends on it. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail(CANNOT_RUN, "cannot set no_new_privs: %s", strerror(errno));
    if (drop != NULL)
        drop_privileges(drop);
    /* Both only after the drop: nothing the caller controls (LD_PRELOAD, ...) reaches
     * a root process, and a workspace handed to that uid may be closed to root. */
    set_environment(argv, end, cwd);
    if (chdir(cwd) != 0)
        fail(CANNOT_RUN, "cannot enter %s: %s", cwd, strerror(errno));
    execvp(argv[end + 1], argv + end + 1);
    fail(errno == ENOENT ? NOT_FOUND : CANNOT_RUN, "%s: %s", argv[end + 1], strerror(errno));
}

static int exit_code(int status) {
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

static int pid1(int argc, char **argv) {
    int end = end_of_options(argc, argv, pid1_options);
    const char *cwd = option(argv, end, "--cwd");
    if (cwd == NULL)
        fail(USAGE, "no --cwd");
    /* Among them the one we were run from: the job gets stdio only. */
    if (close_range(3, ~0U, 0) != 0)
        fail(CANNOT_RUN, "cannot close inherited descriptors: %s", strerror(errno));
    pid_t command = fork();
    if (command < 0)
        fail(CANNOT_RUN, "cannot fork: %s", strerror(errno));
    if (command == 0)
        run_command(argv, end, option(argv, end, "--drop"), cwd);
    /* Orphans of the namespace are reparented to us: reap them while waiting. */
    for (;;) {
        int status;
        pid_t pid = wait(&status);
        if (pid == command)
            return exit_code(status);
        if (pid < 0 && errno != EINTR)
            fail(CANNOT_RUN, "lost the command: %s", strerror(errno));
    }
}

/* --- netns ----------------------------------------------------------------------- */

/* The kernel gives it 127.0.0.1 and ::1 as it comes up. */
static void bring_up_loopback(void) {
    struct ifreq request = {.ifr_name = "lo"};
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0 || ioctl(sock, SIOCGIFFLAGS, &request) != 0)
        fail(NO_NAMESPACE, "cannot read the loopback's flags: %s", strerror(errno));
    request.ifr_flags |= IFF_UP;
    if (ioctl(sock, SIOCSIFFLAGS, &request) != 0)
        fail(NO_NAMESPACE, "cannot bring the loopback up: %s", strerror(errno));
    close(sock);
}

/* Closed TCP connections go at once, instead of lingering for a minute, where the
 * slot's next job would see them (and could not bind their ports). */
static void turn_time_wait_off(void) {
    int fd = open("/proc/sys/net/ipv4/tcp_max_tw_buckets", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1)
        fail(NO_NAMESPACE, "cannot turn TCP TIME_WAIT off: %s", strerror(errno));
    close(fd);
}

static void send_descriptor(int sock, int fd) {
    char byte = 0;
    struct iovec data = {.iov_base = &byte, .iov_len = 1};
    union {
        char buffer[CMSG_SPACE(sizeof fd)];
        struct cmsghdr align;
    } control;
    struct msghdr message = {
        .msg_iov = &data, .msg_iovlen = 1, .msg_control = control.buffer,
        .msg_controllen = sizeof control.buffer,
    };
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(header), &fd, sizeof fd);
    if (sendmsg(sock, &message, 0) != 1)
        fail(NO_NAMESPACE, "cannot send the namespace: %s", strerror(errno));
}

static int netns(int argc, char **argv) {
    if (argc != 4 || strcmp(argv[2], "--send") != 0)
        fail(USAGE, "usage: sandbox-init netns --send SOCKET");
    int sock = (int)number(argv[3], "--send");
    if (unshare(CLONE_NEWNET) != 0)
        fail(NO_NAMESPACE, "cannot create a network namespace: %s", strerror(errno));
    bring_up_loopback();
    turn_time_wait_off();
    int namespace = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (namespace < 0)
        fail(NO_NAMESPACE, "cannot open the network namespace: %s", strerror(errno));
    send_descriptor(sock, namespace);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "host") == 0)
        return host(argc, argv);
    if (argc > 1 && strcmp(argv[1], "pid1") == 0)
        return pid1(argc, argv);
    if (argc > 1 && strcmp(argv[1], "netns") == 0)
        return netns(argc, argv);
    fail(USAGE, "usage: sandbox-init host|pid1 OPTION VALUE... -- COMMAND ARG...\n"
                "       sandbox-init netns --send SOCKET");
}
