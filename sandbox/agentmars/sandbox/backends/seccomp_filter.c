/* Writes the process backend's seccomp filter, a compiled BPF program, on stdout;
 * bubblewrap loads it with --seccomp FD as the last step of setting up a sandbox, so
 * it binds the sandbox's pid 1 and every process of the job, not bubblewrap itself.
 * Built and run by seccomp.py (libseccomp: Debian's libseccomp-dev).
 *
 * Everything is allowed but the calls below, which fail with EPERM as under Docker's
 * default profile (whose blocked list this follows; docs/sandbox.md says where it
 * departs from it and why):
 *   - the kernel keyring: its keys and quota belong to the host uid, which every
 *     session's jobs share, so a key one session stores another reads;
 *   - new namespaces (unshare, setns, clone with a namespace flag; clone3 fails with
 *     ENOSYS instead, so that libc falls back to clone, whose flags can be checked):
 *     a user namespace would give the job every capability inside it, and with them
 *     a large kernel attack surface;
 *   - mounting (bubblewrap has mounted what the job sees already);
 *   - the rest of the kernel's privileged or rarely needed attack surface: modules,
 *     kexec, reboot, BPF, perf events, userfaultfd, io_uring, the clock, swap,
 *     accounting, quotas, file handles, the kernel log, legacy calls.
 * Each needs a capability the job does not have, or is a shared kernel resource.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const denied[] = {
    /* the kernel keyring */
    "add_key", "request_key", "keyctl",
    /* namespaces and mounts */
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    /* kernel modules, kexec, reboot */
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot",
    /* tracing, BPF and other kernel attack surface */
    "bpf", "perf_event_open", "lookup_dcookie", "userfaultfd", "kcmp", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "fanotify_init", "syslog",
    /* the host's clock, swap, accounting, quotas, file handles */
    "settimeofday", "stime", "clock_settime", "clock_adjtime", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "open_by_handle_at", "name_to_handle_at", "vhangup",
    /* legacy */
    "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "vm86", "vm86old", "iopl", "ioperm",
    NULL,
};

static const unsigned long namespace_flags[] = {
    CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
    CLONE_NEWCGROUP, CLONE_NEWTIME,
};

static int fail(const char *what, int error) {
    fprintf(stderr, "seccomp filter: %s: %s\n", what, strerror(-error));
    return 1;
}

/* A syscall this architecture does not have (e.g. vm86 on x86-64) is skipped. */
static int deny(scmp_filter_ctx filter, const char *name, int error) {
    int number = seccomp_syscall_resolve_name(name);
    if (number == __NR_SCMP_ERROR)
        return 0;
    return seccomp_rule_add(filter, SCMP_ACT_ERRNO(error), number, 0);
}

/* The job's 32-bit (and x32) syscalls go through the same filter, not around it. */
static int add_compat_architectures(scmp_filter_ctx filter) {
#if defined(__x86_64__)
    int error = seccomp_arch_add(filter, SCMP_ARCH_X86);
    return error != 0 ? error : seccomp_arch_add(filter, SCMP_ARCH_X32);
#elif defined(__aarch64__)
    return seccomp_arch_add(filter, SCMP_ARCH_ARM);
#else
    (void)filter;
    return 0;
#endif
}

static int deny_new_namespaces(scmp_filter_ctx filter) {
    int error = deny(filter, "clone3", ENOSYS);
    for (size_t i = 0; error == 0 && i < sizeof namespace_flags / sizeof *namespace_flags; i++) {
        unsigned long flag = namespace_flags[i];
#if defined(__s390__) || defined(__s390x__)
        struct scmp_arg_cmp flags = SCMP_A1(SCMP_CMP_MASKED_EQ, flag, flag);
#else
        struct scmp_arg_cmp flags = SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag);
#endif
        error = seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, flags);
    }
    return error;
}

int main(void) {
    scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
    if (filter == NULL)
        return fail("seccomp_init", -ENOMEM);
    int error = add_compat_architectures(filter);
    if (error != 0)
        return fail("adding the compat architectures", error);
    for (const char *const *name = denied; *name != NULL; name++)
        if ((error = deny(filter, *name, EPERM)) != 0)
            return fail(*name, error);
    if ((error = deny_new_namespaces(filter)) != 0)
        return fail("clone", error);
    if ((error = seccomp_export_bpf(filter, STDOUT_FILENO)) != 0)
        return fail("exporting the filter", error);
    seccomp_release(filter);
    return 0;
}
