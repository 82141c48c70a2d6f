// The source of libtributary_client_shared.so: its contents are the client library's archives,
// linked whole (see ../CMakeLists.txt).
