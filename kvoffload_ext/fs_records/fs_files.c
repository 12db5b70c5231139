/* The fs tier's record files, a batch per call: compiled on first use and called through
 * ctypes, which releases the GIL for the call, so a batch's open/write/rename/read system
 * calls run back to back and the tier's I/O threads really overlap.
 *
 * The rules are the Python implementation's (kvoffload/tiers/fs/record_files.py), which stays
 * the reference and the fallback: a bucket's writes run under an exclusive lock on its .used
 * file, whose first 8 bytes (little-endian) count the bytes it holds; an existing record is
 * only touched; a new one is counted first, written to a temporary and renamed into place;
 * anything the count cannot settle here (a bucket to sweep, a count to rebuild, a counter that
 * is not a plain file) is handed back. Every name is opened relative to the bucket's directory
 * descriptor, never through a symlink (O_NOFOLLOW), never blocking on a FIFO (O_NONBLOCK), and
 * only a regular file with one link is read, written or touched; temporaries are created with
 * O_EXCL under random names, so nothing a co-tenant plants in a shared directory redirects a write.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define KVO_WRITTEN 0
#define KVO_EXISTED 1
#define KVO_NEEDS_ROOM 2 /* did not fit the bucket's count: the caller sweeps, then retries */
#define KVO_PENDING 3  /* internal: reserved, not yet written */
#define KVO_IOV 16

static double monotonic_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* An open-file-description lock (not dropped when this process closes another descriptor of
 * the file; it excludes threads too), or a classic POSIX lock where the kernel lacks them. */
static int lock_file(int fd, double timeout_s) {
    struct flock fl = {0};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    int cmd = F_OFD_SETLK;
    double deadline = monotonic_s() + timeout_s;
    struct timespec pause = {0, 500000};
    for (;;) {
        if (fcntl(fd, cmd, &fl) == 0) return 0;
        if (errno == EINVAL && cmd == F_OFD_SETLK) {
            cmd = F_SETLK;
            continue;
        }
        if (errno != EAGAIN && errno != EACCES) return -errno;
        if (monotonic_s() > deadline) return -EBUSY;
        nanosleep(&pause, NULL);
    }
}

static int64_t read_count(int fd) {
    unsigned char raw[8];
    if (pread(fd, raw, 8, 0) != 8) return -1;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | raw[i];
    return (int64_t)v;
}

static int write_count(int fd, int64_t used) {
    unsigned char raw[8];
    uint64_t v = used > 0 ? (uint64_t)used : 0;
    for (int i = 0; i < 8; i++, v >>= 8) raw[i] = (unsigned char)(v & 0xff);
    return pwrite(fd, raw, 8, 0) == 8 ? 0 : -errno;
}

/* Moves every byte of parts [lo, hi) through readv/writev in KVO_IOV-part calls; returns the
 * bytes moved (short only at end of file for reads) or -errno. */
static int64_t move_all(int fd, int writing, const int64_t *ptrs, const int64_t *lens, int64_t lo, int64_t hi) {
    int64_t total = 0;
    int64_t part = lo, done_in_part = 0;
    while (part < hi) {
        struct iovec iov[KVO_IOV];
        int cnt = 0;
        for (int64_t p = part; p < hi && cnt < KVO_IOV; p++, cnt++) {
            int64_t skip = p == part ? done_in_part : 0;
            iov[cnt].iov_base = (char *)(uintptr_t)ptrs[p] + skip;
            iov[cnt].iov_len = (size_t)(lens[p] - skip);
        }
        ssize_t n = writing ? writev(fd, iov, cnt) : readv(fd, iov, cnt);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) {
            if (writing) return -EIO;
            break;
        }
        total += n;
        while (part < hi && n >= lens[part] - done_in_part) {
            n -= lens[part] - done_in_part;
            done_in_part = 0;
            part++;
        }
        done_in_part += n;
    }
    return total;
}

static int64_t parts_size(const int64_t *lens, int64_t lo, int64_t hi) {
    int64_t size = 0;
    for (int64_t p = lo; p < hi; p++) size += lens[p];
    return size;
}

static int64_t allocated(const int64_t *lens, int64_t lo, int64_t hi, int64_t unit) {
    return (parts_size(lens, lo, hi) + unit - 1) / unit * unit;
}

#define KVO_SAFE (O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)

/* name in dir_fd, opened only if it is a regular file with one link; -errno otherwise
 * (-ELOOP for a symlink, FIFO, directory or hard-linked file). */
static int open_own(int dir_fd, const char *name, int flags) {
    int fd = openat(dir_fd, name, flags | KVO_SAFE, 0666);
    if (fd < 0) return errno == EISDIR || errno == ENXIO ? -ELOOP : -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        close(fd);
        return -ELOOP;
    }
    return fd;
}

static int64_t failure(int err) { return err == ENOENT || err == ENOTDIR ? -ENODEV : -err; }

/* One bucket's writes (names in dir_fd). status[i]: KVO_WRITTEN, KVO_EXISTED (touched),
 * KVO_NEEDS_ROOM, -EFBIG (larger than the bucket) or -errno (-ENODEV: the directory is gone).
 * Returns 0, -errno when the lock file cannot be opened or locked (-EBUSY: held past the
 * timeout), or KVO_NEEDS_ROOM when the count is missing or its file is not a plain file of
 * ours (nothing done: the caller recounts, or replaces it). */
int64_t kvo_fs_put(int dir_fd, const char *counter, int64_t capacity, int64_t alloc_unit, double timeout_s,
                   int64_t n, const char *const *temps, const char *const *finals, const int64_t *first_part,
                   const int64_t *ptrs, const int64_t *lens, int64_t *status) {
    int fd = open_own(dir_fd, counter, O_RDWR | O_CREAT);
    if (fd == -ELOOP) return KVO_NEEDS_ROOM;
    if (fd < 0) return failure(-fd);
    int rc = lock_file(fd, timeout_s);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    int64_t used = read_count(fd);
    if (used < 0) {
        close(fd);
        return KVO_NEEDS_ROOM;
    }
    int64_t added = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t need = allocated(lens, first_part[i], first_part[i + 1], alloc_unit);
        int old = open_own(dir_fd, finals[i], O_RDONLY);
        if (old >= 0) {
            futimens(old, NULL); /* another writer's, or ours: now recently used */
            close(old);
            status[i] = KVO_EXISTED;
        } else if (need > capacity) {
            status[i] = -EFBIG;
        } else if (used + added + need > capacity) {
            status[i] = KVO_NEEDS_ROOM;
        } else {
            added += need;
            status[i] = KVO_PENDING;
        }
    }
    if (added > 0 && (rc = write_count(fd, used + added)) < 0) {
        for (int64_t i = 0; i < n; i++)
            if (status[i] == KVO_PENDING) status[i] = failure((int)-rc);
        close(fd);
        return 0;
    }
    int64_t unwritten = 0;
    for (int64_t i = 0; i < n; i++) {
        if (status[i] != KVO_PENDING) continue;
        int out = openat(dir_fd, temps[i], O_WRONLY | O_CREAT | O_EXCL | KVO_SAFE, 0666);
        int err = 0;
        if (out < 0) {
            err = errno;
        } else {
            int64_t moved = move_all(out, 1, ptrs, lens, first_part[i], first_part[i + 1]);
            if (moved < 0) err = (int)-moved;
            if (close(out) != 0 && err == 0) err = errno;
            if (err == 0 && renameat(dir_fd, temps[i], dir_fd, finals[i]) != 0) err = errno;
            if (err != 0) unlinkat(dir_fd, temps[i], 0);
        }
        if (err == 0) {
            status[i] = KVO_WRITTEN;
        } else {
            status[i] = failure(err);
            unwritten += allocated(lens, first_part[i], first_part[i + 1], alloc_unit);
        }
    }
    if (unwritten > 0) write_count(fd, used + added - unwritten);
    close(fd); /* releases the lock */
    return 0;
}

/* Reads whole records (names[i] in dir_fds[i]). status[i]: the bytes read; the file's size
 * instead when it differs from the parts' total (nothing read: not a record of this layout);
 * -ELOOP when the name is not a regular file of one link; or -errno. A record whose mtime is
 * older than touch_after_s gets it refreshed (its recency, for evictions). */
void kvo_fs_get(int64_t n, const int64_t *dir_fds, const char *const *names, const int64_t *first_part,
                const int64_t *ptrs, const int64_t *lens, double touch_after_s, int64_t *status) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int64_t i = 0; i < n; i++) {
        int fd = open_own((int)dir_fds[i], names[i], O_RDONLY);
        if (fd < 0) {
            status[i] = fd;
            continue;
        }
        int64_t size = parts_size(lens, first_part[i], first_part[i + 1]);
        struct stat st;
        if (fstat(fd, &st) != 0) {
            status[i] = -errno;
        } else if (st.st_size != size) {
            status[i] = st.st_size;
        } else {
            status[i] = move_all(fd, 0, ptrs, lens, first_part[i], first_part[i + 1]);
            double age = (double)(now.tv_sec - st.st_mtim.tv_sec) + (double)(now.tv_nsec - st.st_mtim.tv_nsec) * 1e-9;
            if (status[i] >= 0 && age > touch_after_s) futimens(fd, NULL);
        }
        close(fd);
    }
}
