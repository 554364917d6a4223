/* file.c -- read-only mappings, whole-file reads, atomic writes, paths.
 * Every error message names the path and the failing operation. */
#include "base.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

rlm_status rlm__file_map(rlm_mapped_file *f, const char *path, rlm_error *err) {
  memset(f, 0, sizeof *f);
  rlm_status rc = RLM_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return rlm__err(err, RLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = rlm__err(err, RLM_ERR_IO, "%s: not a regular file", path);
    goto out_close_fd;
  }
  f->path = rlm__strdup(path);
  if (!f->path) {
    rc = rlm__err_nomem(err, path, strlen(path));
    goto out_close_fd;
  }
  f->size = (size_t)st.st_size;
  if (f->size > 0) {
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      rc = rlm__err(err, RLM_ERR_IO, "%s: mmap of %zu bytes failed: %s", path,
                    f->size, strerror(errno));
      rlm__free(f->path);
      memset(f, 0, sizeof *f);
      goto out_close_fd;
    }
    f->data = p;
  }
out_close_fd:
  close(fd); /* the mapping outlives the descriptor */
  return rc;
}

void rlm__file_unmap(rlm_mapped_file *f) {
  if (!f) return;
  if (f->data) munmap((void *)f->data, f->size);
  rlm__free(f->path);
  memset(f, 0, sizeof *f);
}

rlm_status rlm__file_read_all(const char *path, char **out, size_t *len,
                              rlm_error *err) {
  *out = NULL;
  rlm_mapped_file f;
  rlm_status rc = rlm__file_map(&f, path, err);
  if (rc) return rc;
  char *buf = rlm__malloc(f.size + 1);
  if (!buf) {
    rc = rlm__err_nomem(err, path, f.size + 1);
  } else {
    if (f.size) memcpy(buf, f.data, f.size);
    buf[f.size] = 0;
    *out = buf;
    if (len) *len = f.size;
  }
  rlm__file_unmap(&f);
  return rc;
}

bool rlm__path_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool rlm__path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

char *rlm__path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = rlm__malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  size_t n = a;
  if (n && p[n - 1] != '/') p[n++] = '/';
  memcpy(p + n, name, b + 1);
  return p;
}

rlm_status rlm__mkdir(const char *path, rlm_error *err) {
  if (mkdir(path, 0755) == 0 || (errno == EEXIST && rlm__path_is_dir(path)))
    return RLM_OK;
  return rlm__err(err, RLM_ERR_IO, "%s: cannot create directory: %s", path,
                  strerror(errno));
}

/* ---------------------------------------------------------------------- */

rlm_status rlm__writer_open(rlm_file_writer *w, const char *path,
                            rlm_error *err) {
  memset(w, 0, sizeof *w);
  w->fd = -1;
  size_t n = strlen(path) + 32;
  w->path = rlm__strdup(path);
  w->tmp_path = rlm__malloc(n);
  if (!w->path || !w->tmp_path) {
    rlm__writer_abort(w);
    return rlm__err_nomem(err, path, n);
  }
  snprintf(w->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
  w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    rlm_status rc = rlm__err(err, RLM_ERR_IO, "%s: cannot create: %s",
                             w->tmp_path, strerror(errno));
    rlm__writer_abort(w);
    return rc;
  }
  return RLM_OK;
}

static _Atomic int64_t g_io_fail_at = -1;
static _Atomic int g_io_fail_errno;

void rlm__io_fail_at(int64_t nth, int e) {
  atomic_store(&g_io_fail_errno, e);
  atomic_store(&g_io_fail_at, nth);
}

/* True (errno set) if this write or fsync must fail (fault injection). */
static bool io_should_fail(void) {
  int64_t n = atomic_load(&g_io_fail_at);
  while (n >= 0)
    if (atomic_compare_exchange_weak(&g_io_fail_at, &n, n - 1)) {
      if (n == 0) errno = atomic_load(&g_io_fail_errno);
      return n == 0;
    }
  return false;
}

/* Makes a rename in path's folder durable. */
static rlm_status sync_parent(const char *path, rlm_error *err) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool ok = fd >= 0 && !io_should_fail() && fsync(fd) == 0;
  int e = errno;
  if (fd >= 0) close(fd);
  return ok ? RLM_OK : rlm__err(err, RLM_ERR_IO, "%s: cannot sync the folder: %s", dir, strerror(e));
}

rlm_status rlm__writer_write(rlm_file_writer *w, const void *p, size_t n,
                             rlm_error *err) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = io_should_fail() ? -1 : write(w->fd, b, n > (1u << 30) ? (1u << 30) : n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return rlm__err(err, RLM_ERR_IO, "%s: write failed: %s", w->tmp_path,
                      k < 0 ? strerror(errno) : "no progress");
    b += k;
    n -= (size_t)k;
    w->written += (uint64_t)k;
  }
  return RLM_OK;
}

/* Removes what writers of `path` killed mid-write left: `path.tmp.<pid>`
 * for a pid that no longer runs here. Best effort, after a commit: a
 * living writer's temporary (another process saving the same file) is
 * kept, and what cannot be read or removed is left. */
static void remove_stale_temps(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  char dir[4096];
  if (!slash || slash == path) snprintf(dir, sizeof dir, "%s", slash ? "/" : ".");
  else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  else return;
  DIR *d = opendir(dir);
  if (!d) return;
  const size_t bn = strlen(base);
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, base, bn) || strncmp(e->d_name + bn, ".tmp.", 5)) continue;
    char *end;
    const long pid = strtol(e->d_name + bn + 5, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

rlm_status rlm__writer_commit(rlm_file_writer *w, rlm_error *err) {
  rlm_status rc = RLM_OK;
  bool synced = !io_should_fail() && fsync(w->fd) == 0;
  int e = errno;
  if (close(w->fd) != 0 && synced) synced = false, e = errno;
  w->fd = -1;
  if (!synced) {
    rc = rlm__err(err, RLM_ERR_IO, "%s: flush failed: %s", w->tmp_path, strerror(e));
  } else if (rename(w->tmp_path, w->path) != 0) {
    rc = rlm__err(err, RLM_ERR_IO, "%s: cannot rename into place: %s",
                  w->path, strerror(errno));
  } else {
    rc = sync_parent(w->path, err); /* the new file is in place either way */
    remove_stale_temps(w->path);
  }
  if (rc) unlink(w->tmp_path);
  rlm__free(w->path);
  rlm__free(w->tmp_path);
  memset(w, 0, sizeof *w);
  w->fd = -1;
  return rc;
}

void rlm__writer_abort(rlm_file_writer *w) {
  if (w->fd >= 0) close(w->fd);
  if (w->tmp_path) unlink(w->tmp_path);
  rlm__free(w->path);
  rlm__free(w->tmp_path);
  memset(w, 0, sizeof *w);
  w->fd = -1;
}

rlm_status rlm__file_copy(const char *src, const char *dst, rlm_error *err) {
  rlm_mapped_file f;
  rlm_status rc = rlm__file_map(&f, src, err);
  if (rc) return rc;
  rlm_file_writer w;
  rc = rlm__writer_open(&w, dst, err);
  if (rc) goto out_unmap;
  rc = rlm__writer_write(&w, f.data, f.size, err);
  if (rc) {
    rlm__writer_abort(&w);
    goto out_unmap;
  }
  rc = rlm__writer_commit(&w, err);
out_unmap:
  rlm__file_unmap(&f);
  return rc;
}

rlm_status rlm__file_write_atomic(const char *path, const void *buf, size_t n, rlm_error *err) {
  rlm_file_writer w;
  rlm_status rc = rlm__writer_open(&w, path, err);
  if (rc) return rc;
  if ((rc = rlm__writer_write(&w, buf, n, err))) {
    rlm__writer_abort(&w);
    return rc;
  }
  return rlm__writer_commit(&w, err);
}
