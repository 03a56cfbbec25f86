/*
 * An LD_PRELOAD library that records, in order, every change a process makes to the files
 * under some directories and every sync that makes such a change durable, so that a test can
 * rebuild the files as a power cut at any point of the run would have left them (see
 * powercut.py).  Built by the tests from this source with gcc; never shipped.
 *
 * Environment:
 *   POWERCUT_LOG    the journal to append records to (shared by every traced process)
 *   POWERCUT_ROOTS  colon-separated absolute directories whose files are traced
 *
 * Records (one write(2) each to an O_APPEND file, so processes do not interleave them):
 *   C <ino> <path>            a new file was created at <path>
 *   O <ino> <path>            an existing file was opened
 *   W <ino> <offset> <len>    <len> bytes follow: written at <offset>
 *   T <ino> <size>            the file's size was set (ftruncate, O_TRUNC, fallocate)
 *   S <ino>                   fsync/fdatasync of a file: its contents are durable
 *   D <path>                  fsync of a directory: its entries are durable
 *   R <old> <new>             rename
 *   U <path>                  unlink
 *   M <path>                  mkdir
 *   X <path>                  rmdir
 *   A                         sync/syncfs: everything is durable
 * Hard links, copy_file_range and writes through memory maps are not followed: the first two
 * abort the process; memory-mapped files (SQLite's -shm) are left out of the rebuilt files.
 * Fields are separated by tabs and each header ends with a newline.  Every record is written
 * after the operation it describes returned, while a process-wide lock is held, so the order
 * of the journal is the order of the effects.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 65536
#define MAX_ROOTS 8

enum { UNTRACKED = 0, TRACKED_FILE = 1, TRACKED_DIR = 2 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static char *roots[MAX_ROOTS];
static size_t root_lens[MAX_ROOTS];
static int root_count = 0;
static unsigned char kind[MAX_FD];
static unsigned char sync_writes[MAX_FD]; /* opened O_SYNC/O_DSYNC */
static ino_t inode[MAX_FD];
static char *dir_path[MAX_FD];

#define REAL(name) static __typeof__(name) *real_##name
REAL(open);
REAL(open64);
REAL(openat);
REAL(openat64);
REAL(creat);
REAL(close);
REAL(write);
REAL(pwrite);
REAL(pwrite64);
REAL(writev);
REAL(pwritev);
REAL(pwritev64);
REAL(pwritev2);
REAL(pwritev64v2);
REAL(ftruncate);
REAL(ftruncate64);
REAL(truncate);
REAL(truncate64);
REAL(fsync);
REAL(fdatasync);
REAL(rename);
REAL(renameat);
REAL(renameat2);
REAL(unlink);
REAL(unlinkat);
REAL(mkdir);
REAL(mkdirat);
REAL(rmdir);
REAL(dup);
REAL(dup2);
REAL(dup3);
REAL(fallocate);
REAL(posix_fallocate);
REAL(posix_fallocate64);
REAL(link);
REAL(linkat);
REAL(copy_file_range);
REAL(sync);
REAL(syncfs);

static void *resolve(const char *name) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (!fn) {
        fprintf(stderr, "powercut: cannot resolve %s\n", name);
        abort();
    }
    return fn;
}

__attribute__((constructor)) static void init(void) {
    real_open = resolve("open");
    real_open64 = resolve("open64");
    real_openat = resolve("openat");
    real_openat64 = resolve("openat64");
    real_creat = resolve("creat");
    real_close = resolve("close");
    real_write = resolve("write");
    real_pwrite = resolve("pwrite");
    real_pwrite64 = resolve("pwrite64");
    real_writev = resolve("writev");
    real_pwritev = resolve("pwritev");
    real_pwritev64 = resolve("pwritev64");
    real_pwritev2 = resolve("pwritev2");
    real_pwritev64v2 = resolve("pwritev64v2");
    real_ftruncate = resolve("ftruncate");
    real_ftruncate64 = resolve("ftruncate64");
    real_truncate = resolve("truncate");
    real_truncate64 = resolve("truncate64");
    real_fsync = resolve("fsync");
    real_fdatasync = resolve("fdatasync");
    real_rename = resolve("rename");
    real_renameat = resolve("renameat");
    real_renameat2 = resolve("renameat2");
    real_unlink = resolve("unlink");
    real_unlinkat = resolve("unlinkat");
    real_mkdir = resolve("mkdir");
    real_mkdirat = resolve("mkdirat");
    real_rmdir = resolve("rmdir");
    real_dup = resolve("dup");
    real_dup2 = resolve("dup2");
    real_dup3 = resolve("dup3");
    real_fallocate = resolve("fallocate");
    real_posix_fallocate = resolve("posix_fallocate");
    real_posix_fallocate64 = resolve("posix_fallocate64");
    real_link = resolve("link");
    real_linkat = resolve("linkat");
    real_copy_file_range = resolve("copy_file_range");
    real_sync = resolve("sync");
    real_syncfs = resolve("syncfs");

    const char *log_path = getenv("POWERCUT_LOG");
    const char *root_list = getenv("POWERCUT_ROOTS");
    if (!log_path || !root_list) return;
    int fd = real_open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror("powercut: cannot open POWERCUT_LOG");
        abort();
    }
    /* far from the descriptors the process uses, so that nothing reuses or closes it */
    log_fd = fcntl(fd, F_DUPFD_CLOEXEC, 1000);
    real_close(fd);
    char *copy = strdup(root_list);
    for (char *save = NULL, *root = strtok_r(copy, ":", &save); root && root_count < MAX_ROOTS;
         root = strtok_r(NULL, ":", &save)) {
        roots[root_count] = root;
        root_lens[root_count] = strlen(root);
        root_count++;
    }
}

static void emit(const char *header, size_t header_len, const struct iovec *data, int data_count,
                 size_t data_len) {
    size_t total = header_len + data_len;
    char *record = malloc(total);
    if (!record) abort();
    memcpy(record, header, header_len);
    size_t pos = header_len;
    for (int i = 0; i < data_count && pos < total; i++) {
        size_t n = data[i].iov_len;
        if (n > total - pos) n = total - pos;
        memcpy(record + pos, data[i].iov_base, n);
        pos += n;
    }
    for (size_t done = 0; done < total;) {
        ssize_t n = real_write(log_fd, record + done, total - done);
        if (n <= 0) {
            perror("powercut: cannot write the journal");
            abort();
        }
        done += (size_t)n;
    }
    free(record);
}

static void emitf(const char *fmt, ...) {
    char header[3 * PATH_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(header, sizeof header, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof header) abort();
    emit(header, (size_t)n, NULL, 0, 0);
}

/* The absolute path of ``path`` relative to ``dirfd``, into ``out``; 0 if it cannot be had. */
static int absolute(int dirfd, const char *path, char *out) {
    if (path[0] == '/') {
        if (strlen(path) >= PATH_MAX) return 0;
        strcpy(out, path);
        return 1;
    }
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n <= 0) return 0;
        base[n] = 0;
    }
    if (strlen(base) + strlen(path) + 2 > PATH_MAX) return 0;
    snprintf(out, PATH_MAX, "%s/%s", base, path);
    return 1;
}

static int under_roots(const char *abs) {
    if (log_fd < 0) return 0;
    for (int i = 0; i < root_count; i++) {
        size_t n = root_lens[i];
        if (strncmp(abs, roots[i], n) == 0 && (abs[n] == '/' || abs[n] == 0)) {
            if (strchr(abs, '\t') || strchr(abs, '\n')) {
                fprintf(stderr, "powercut: a traced path holds a tab or newline: %s\n", abs);
                abort();
            }
            return 1;
        }
    }
    return 0;
}

static int traced_path(int dirfd, const char *path, char *abs) {
    return log_fd >= 0 && path && absolute(dirfd, path, abs) && under_roots(abs);
}

static int traced_fd(int fd) { return fd >= 0 && fd < MAX_FD && kind[fd] != UNTRACKED; }

static void forget_fd(int fd) {
    if (fd < 0 || fd >= MAX_FD) return;
    kind[fd] = UNTRACKED;
    sync_writes[fd] = 0;
    free(dir_path[fd]);
    dir_path[fd] = NULL;
}

static void copy_fd(int from, int to) {
    if (to < 0 || to >= MAX_FD) return;
    forget_fd(to);
    if (!traced_fd(from)) return;
    kind[to] = kind[from];
    sync_writes[to] = sync_writes[from];
    inode[to] = inode[from];
    dir_path[to] = dir_path[from] ? strdup(dir_path[from]) : NULL;
}

static int do_open(int dirfd, const char *path, int flags, mode_t mode, int at, int large) {
    char abs[PATH_MAX];
    if (!traced_path(dirfd, path, abs)) {
        if (at) return large ? real_openat64(dirfd, path, flags, mode)
                             : real_openat(dirfd, path, flags, mode);
        return large ? real_open64(path, flags, mode) : real_open(path, flags, mode);
    }
    pthread_mutex_lock(&lock);
    struct stat before;
    int existed = stat(abs, &before) == 0;
    int fd = at ? (large ? real_openat64(dirfd, path, flags, mode)
                         : real_openat(dirfd, path, flags, mode))
                : (large ? real_open64(path, flags, mode) : real_open(path, flags, mode));
    int saved = errno;
    if (fd >= 0 && fd < MAX_FD) {
        struct stat st;
        forget_fd(fd);
        if (fstat(fd, &st) == 0) {
            if (S_ISDIR(st.st_mode)) {
                kind[fd] = TRACKED_DIR;
                dir_path[fd] = strdup(abs);
            } else if (S_ISREG(st.st_mode)) {
                kind[fd] = TRACKED_FILE;
                inode[fd] = st.st_ino;
                sync_writes[fd] = (flags & (O_SYNC | O_DSYNC)) != 0;
                emitf("%c\t%lu\t%s\n", existed ? 'O' : 'C', (unsigned long)st.st_ino, abs);
                if (existed && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY)
                    emitf("T\t%lu\t0\n", (unsigned long)st.st_ino);
            }
        }
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return fd;
}

static mode_t open_mode(int flags, va_list ap) {
    return ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    return do_open(AT_FDCWD, path, flags, mode, 0, 0);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    return do_open(AT_FDCWD, path, flags, mode, 0, 1);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    return do_open(dirfd, path, flags, mode, 1, 0);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    return do_open(dirfd, path, flags, mode, 1, 1);
}

int creat(const char *path, mode_t mode) {
    return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0, 0);
}

int close(int fd) {
    if (fd == log_fd && fd >= 0) return 0; /* the journal stays open */
    if (!traced_fd(fd)) return real_close(fd);
    pthread_mutex_lock(&lock);
    forget_fd(fd);
    int rc = real_close(fd);
    int saved = errno;
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

static void emit_write(int fd, off_t offset, const struct iovec *iov, int count, size_t n) {
    char header[128];
    int len = snprintf(header, sizeof header, "W\t%lu\t%lld\t%zu\n", (unsigned long)inode[fd],
                       (long long)offset, n);
    emit(header, (size_t)len, iov, count, n);
    if (sync_writes[fd]) emitf("S\t%lu\n", (unsigned long)inode[fd]);
}

ssize_t write(int fd, const void *buf, size_t n) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_write(fd, buf, n);
    pthread_mutex_lock(&lock);
    ssize_t rc = real_write(fd, buf, n);
    int saved = errno;
    if (rc > 0) {
        struct iovec iov = {(void *)buf, (size_t)rc};
        emit_write(fd, lseek(fd, 0, SEEK_CUR) - rc, &iov, 1, (size_t)rc);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

static ssize_t traced_pwrite(int fd, const void *buf, size_t n, off_t offset, int large) {
    pthread_mutex_lock(&lock);
    ssize_t rc = large ? real_pwrite64(fd, buf, n, offset) : real_pwrite(fd, buf, n, offset);
    int saved = errno;
    if (rc > 0) {
        struct iovec iov = {(void *)buf, (size_t)rc};
        emit_write(fd, offset, &iov, 1, (size_t)rc);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_pwrite(fd, buf, n, offset);
    return traced_pwrite(fd, buf, n, offset, 0);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t offset) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_pwrite64(fd, buf, n, offset);
    return traced_pwrite(fd, buf, n, offset, 1);
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_writev(fd, iov, count);
    pthread_mutex_lock(&lock);
    ssize_t rc = real_writev(fd, iov, count);
    int saved = errno;
    if (rc > 0) emit_write(fd, lseek(fd, 0, SEEK_CUR) - rc, iov, count, (size_t)rc);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

static ssize_t traced_pwritev(int fd, const struct iovec *iov, int count, off_t offset,
                              int flags, int variant) {
    pthread_mutex_lock(&lock);
    ssize_t rc = variant == 0   ? real_pwritev(fd, iov, count, offset)
                 : variant == 1 ? real_pwritev64(fd, iov, count, offset)
                 : variant == 2 ? real_pwritev2(fd, iov, count, offset, flags)
                                : real_pwritev64v2(fd, iov, count, offset, flags);
    int saved = errno;
    if (rc > 0) {
        off_t at = offset == -1 ? lseek(fd, 0, SEEK_CUR) - rc : offset;
        emit_write(fd, at, iov, count, (size_t)rc);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_pwritev(fd, iov, count, offset);
    return traced_pwritev(fd, iov, count, offset, 0, 0);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off_t offset) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE)
        return real_pwritev64(fd, iov, count, offset);
    return traced_pwritev(fd, iov, count, offset, 0, 1);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int count, off_t offset, int flags) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE)
        return real_pwritev2(fd, iov, count, offset, flags);
    return traced_pwritev(fd, iov, count, offset, flags, 2);
}

ssize_t pwritev64v2(int fd, const struct iovec *iov, int count, off_t offset, int flags) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE)
        return real_pwritev64v2(fd, iov, count, offset, flags);
    return traced_pwritev(fd, iov, count, offset, flags, 3);
}

static int traced_ftruncate(int fd, off_t size, int large) {
    pthread_mutex_lock(&lock);
    int rc = large ? real_ftruncate64(fd, size) : real_ftruncate(fd, size);
    int saved = errno;
    if (rc == 0) emitf("T\t%lu\t%lld\n", (unsigned long)inode[fd], (long long)size);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

int ftruncate(int fd, off_t size) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_ftruncate(fd, size);
    return traced_ftruncate(fd, size, 0);
}

int ftruncate64(int fd, off_t size) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_ftruncate64(fd, size);
    return traced_ftruncate(fd, size, 1);
}

static int traced_truncate(const char *path, off_t size, int large) {
    char abs[PATH_MAX];
    if (!traced_path(AT_FDCWD, path, abs))
        return large ? real_truncate64(path, size) : real_truncate(path, size);
    pthread_mutex_lock(&lock);
    int rc = large ? real_truncate64(path, size) : real_truncate(path, size);
    int saved = errno;
    struct stat st;
    if (rc == 0 && stat(abs, &st) == 0)
        emitf("T\t%lu\t%lld\n", (unsigned long)st.st_ino, (long long)size);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

int truncate(const char *path, off_t size) { return traced_truncate(path, size, 0); }

int truncate64(const char *path, off_t size) { return traced_truncate(path, size, 1); }

static int traced_extend(int fd, off_t offset, off_t len, int rc) {
    /* only a size change matters: the new bytes read as zeros either way */
    struct stat st;
    if (rc == 0 && fstat(fd, &st) == 0)
        emitf("T\t%lu\t%lld\n", (unsigned long)inode[fd], (long long)st.st_size);
    (void)offset;
    (void)len;
    return rc;
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE) return real_fallocate(fd, mode, offset, len);
    pthread_mutex_lock(&lock);
    int rc = real_fallocate(fd, mode, offset, len);
    int saved = errno;
    traced_extend(fd, offset, len, rc);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

static int traced_posix_fallocate(int fd, off_t offset, off_t len, int large) {
    if (!traced_fd(fd) || kind[fd] != TRACKED_FILE)
        return large ? real_posix_fallocate64(fd, offset, len)
                     : real_posix_fallocate(fd, offset, len);
    pthread_mutex_lock(&lock);
    int rc = large ? real_posix_fallocate64(fd, offset, len)
                   : real_posix_fallocate(fd, offset, len);
    traced_extend(fd, offset, len, rc);
    pthread_mutex_unlock(&lock);
    return rc;
}

int posix_fallocate(int fd, off_t offset, off_t len) {
    return traced_posix_fallocate(fd, offset, len, 0);
}

int posix_fallocate64(int fd, off_t offset, off_t len) {
    return traced_posix_fallocate(fd, offset, len, 1);
}

/* Ways to change traced files that the model does not follow: refused loudly, never missed. */
static void not_modelled(const char *what, const char *abs) {
    fprintf(stderr, "powercut: %s on a traced file is not modelled: %s\n", what, abs);
    abort();
}

int link(const char *old, const char *new) {
    char abs[PATH_MAX];
    if (traced_path(AT_FDCWD, new, abs)) not_modelled("link", abs);
    return real_link(old, new);
}

int linkat(int olddirfd, const char *old, int newdirfd, const char *new, int flags) {
    char abs[PATH_MAX];
    if (traced_path(newdirfd, new, abs)) not_modelled("linkat", abs);
    return real_linkat(olddirfd, old, newdirfd, new, flags);
}

ssize_t copy_file_range(int in, loff_t *in_off, int out, loff_t *out_off, size_t len,
                        unsigned flags) {
    if (traced_fd(out)) not_modelled("copy_file_range", "(descriptor)");
    return real_copy_file_range(in, in_off, out, out_off, len, flags);
}

static int traced_sync(int fd, int data_only) {
    pthread_mutex_lock(&lock);
    int rc = data_only ? real_fdatasync(fd) : real_fsync(fd);
    int saved = errno;
    if (rc == 0) {
        if (kind[fd] == TRACKED_DIR)
            emitf("D\t%s\n", dir_path[fd]);
        else
            emitf("S\t%lu\n", (unsigned long)inode[fd]);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

int fsync(int fd) {
    if (!traced_fd(fd)) return real_fsync(fd);
    return traced_sync(fd, 0);
}

int fdatasync(int fd) {
    if (!traced_fd(fd)) return real_fdatasync(fd);
    return traced_sync(fd, 1);
}

void sync(void) {
    pthread_mutex_lock(&lock);
    real_sync();
    if (log_fd >= 0) emitf("A\n");
    pthread_mutex_unlock(&lock);
}

int syncfs(int fd) {
    pthread_mutex_lock(&lock);
    int rc = real_syncfs(fd);
    int saved = errno;
    if (rc == 0 && log_fd >= 0) emitf("A\n");
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

static int traced_rename(int olddirfd, const char *old, int newdirfd, const char *new,
                         unsigned flags, int variant) {
    char abs_old[PATH_MAX], abs_new[PATH_MAX];
    int traced = traced_path(olddirfd, old, abs_old) | traced_path(newdirfd, new, abs_new);
    if (traced) pthread_mutex_lock(&lock);
    int rc = variant == 0   ? real_rename(old, new)
             : variant == 1 ? real_renameat(olddirfd, old, newdirfd, new)
                            : real_renameat2(olddirfd, old, newdirfd, new, flags);
    int saved = errno;
    if (traced) {
        if (rc == 0) {
            if (flags & RENAME_EXCHANGE) {
                fprintf(stderr, "powercut: RENAME_EXCHANGE is not modelled\n");
                abort();
            }
            emitf("R\t%s\t%s\n", abs_old, abs_new);
        }
        pthread_mutex_unlock(&lock);
    }
    errno = saved;
    return rc;
}

int rename(const char *old, const char *new) {
    return traced_rename(AT_FDCWD, old, AT_FDCWD, new, 0, 0);
}

int renameat(int olddirfd, const char *old, int newdirfd, const char *new) {
    return traced_rename(olddirfd, old, newdirfd, new, 0, 1);
}

int renameat2(int olddirfd, const char *old, int newdirfd, const char *new, unsigned flags) {
    return traced_rename(olddirfd, old, newdirfd, new, flags, 2);
}

static int traced_path_op(int dirfd, const char *path, char op, int (*fn)(void *), void *arg) {
    char abs[PATH_MAX];
    if (!traced_path(dirfd, path, abs)) return fn(arg);
    pthread_mutex_lock(&lock);
    int rc = fn(arg);
    int saved = errno;
    if (rc == 0) emitf("%c\t%s\n", op, abs);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

struct path_args {
    int dirfd;
    const char *path;
    int flags;
    mode_t mode;
};

static int call_unlink(void *a) { return real_unlink(((struct path_args *)a)->path); }
static int call_unlinkat(void *a) {
    struct path_args *p = a;
    return real_unlinkat(p->dirfd, p->path, p->flags);
}
static int call_mkdir(void *a) {
    struct path_args *p = a;
    return real_mkdir(p->path, p->mode);
}
static int call_mkdirat(void *a) {
    struct path_args *p = a;
    return real_mkdirat(p->dirfd, p->path, p->mode);
}
static int call_rmdir(void *a) { return real_rmdir(((struct path_args *)a)->path); }

int unlink(const char *path) {
    struct path_args a = {AT_FDCWD, path, 0, 0};
    return traced_path_op(AT_FDCWD, path, 'U', call_unlink, &a);
}

int unlinkat(int dirfd, const char *path, int flags) {
    struct path_args a = {dirfd, path, flags, 0};
    return traced_path_op(dirfd, path, (flags & AT_REMOVEDIR) ? 'X' : 'U', call_unlinkat, &a);
}

int mkdir(const char *path, mode_t mode) {
    struct path_args a = {AT_FDCWD, path, 0, mode};
    return traced_path_op(AT_FDCWD, path, 'M', call_mkdir, &a);
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
    struct path_args a = {dirfd, path, 0, mode};
    return traced_path_op(dirfd, path, 'M', call_mkdirat, &a);
}

int rmdir(const char *path) {
    struct path_args a = {AT_FDCWD, path, 0, 0};
    return traced_path_op(AT_FDCWD, path, 'X', call_rmdir, &a);
}

int dup(int fd) {
    int rc = real_dup(fd);
    if (rc >= 0 && traced_fd(fd)) {
        pthread_mutex_lock(&lock);
        copy_fd(fd, rc);
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

int dup2(int fd, int to) {
    int rc = real_dup2(fd, to);
    if (rc >= 0 && (traced_fd(fd) || traced_fd(to))) {
        pthread_mutex_lock(&lock);
        copy_fd(fd, rc);
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

int dup3(int fd, int to, int flags) {
    int rc = real_dup3(fd, to, flags);
    if (rc >= 0 && (traced_fd(fd) || traced_fd(to))) {
        pthread_mutex_lock(&lock);
        copy_fd(fd, rc);
        pthread_mutex_unlock(&lock);
    }
    return rc;
}
