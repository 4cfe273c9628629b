/* Helpers the two loaders share: opening the first library of a list that
 * loads, and collecting what was tried into the error message. */
#ifndef PYAR_LOADER_UTIL_H
#define PYAR_LOADER_UTIL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void pyar_append_error(char *error, size_t error_size, const char *text) {
  size_t used = strlen(error);
  if (used + 1 >= error_size) return;
  snprintf(error + used, error_size - used, "%s%s", used ? "; " : "", text);
}

/* Opens the library named by the environment variable override, or else the
 * first candidate that loads.  On failure appends "<label>: tried ..." with
 * dlerror's reason for every name. */
static void *pyar_open_first(const char *label, const char *override_env,
                             const char *const *candidates, char *path,
                             size_t path_size, char *error, size_t error_size) {
  const char *override = getenv(override_env);
  const char *only[2] = {override, NULL};
  const char *const *names = (override && override[0]) ? only : candidates;
  char tried[1024] = "";
  for (const char *const *name = names; *name; ++name) {
    void *handle = dlopen(*name, RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      snprintf(path, path_size, "%s", *name);
      return handle;
    }
    const char *why = dlerror();
    size_t used = strlen(tried);
    /* dlerror's text names the library and the reason. */
    snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", why ? why : *name);
  }
  char message[1200];
  snprintf(message, sizeof message, "%s: tried %s", label, tried);
  pyar_append_error(error, error_size, message);
  return NULL;
}

#endif
