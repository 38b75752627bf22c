#include "quintet/io/h5.hpp"

#include "quintet/core/error.hpp"

namespace quintet::h5 {

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

hid_t check(hid_t id, const std::string& what) {
    if (id < 0) rank_fail("HDF5: " + what);
    return id;
}

namespace {
Handle untimed(hid_t cls, const char* what) {
    Handle p = plist(check(H5Pcreate(cls), what));
    check(H5Pset_obj_track_times(p, false), what);
    return p;
}
}  // namespace

Handle file_create_plist() { return untimed(H5P_FILE_CREATE, "file creation property list"); }
Handle group_create_plist() { return untimed(H5P_GROUP_CREATE, "group creation property list"); }
Handle dataset_create_plist() { return untimed(H5P_DATASET_CREATE, "dataset creation property list"); }

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
    Handle t = type(H5Tcopy(H5T_C_S1));
    H5Tset_size(t, value.empty() ? 1 : value.size());
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    Handle s = space(H5Screate(H5S_SCALAR));
    if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
    Handle a = attr(check(H5Acreate2(obj, name.c_str(), t, s, H5P_DEFAULT, H5P_DEFAULT),
                          "create attribute " + name));
    check(H5Awrite(a, t, value.empty() ? "" : value.data()), "write attribute " + name);
}

void write_attr_i64(hid_t obj, const std::string& name, int64_t value) {
    Handle s = space(H5Screate(H5S_SCALAR));
    if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
    Handle a = attr(check(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT),
                          "create attribute " + name));
    check(H5Awrite(a, H5T_NATIVE_INT64, &value), "write attribute " + name);
}

void write_attr_f64(hid_t obj, const std::string& name, double value) {
    Handle s = space(H5Screate(H5S_SCALAR));
    if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
    Handle a = attr(check(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT),
                          "create attribute " + name));
    check(H5Awrite(a, H5T_NATIVE_DOUBLE, &value), "write attribute " + name);
}

void write_f64(hid_t loc, const std::string& name, const std::vector<double>& v, const std::vector<hsize_t>& dims) {
    std::vector<hsize_t> d = dims.empty() ? std::vector<hsize_t>{hsize_t(v.size())} : dims;
    Handle s = space(check(H5Screate_simple(int(d.size()), d.data(), nullptr), "dataspace " + name));
    Handle ds = dataset(check(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F64LE, s, H5P_DEFAULT, dataset_create_plist(), H5P_DEFAULT),
                              "create dataset " + name));
    if (!v.empty()) check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "write " + name);
}

std::vector<double> read_f64(hid_t loc, const std::string& path, std::vector<hsize_t>* dims) {
    std::vector<double> v;
    if (!exists(loc, path)) return v;
    Handle ds = dataset(check(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), "open dataset " + path));
    const std::vector<hsize_t> shape = dataset_shape(ds);
    size_t n = 1;
    for (hsize_t d : shape) n *= size_t(d);
    v.resize(n);
    if (n) check(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "read " + path);
    if (dims) *dims = shape;
    return v;
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string read_attr_string(hid_t obj, const std::string& name) {
    Handle a = attr(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "open attribute " + name));
    Handle t = type(H5Aget_type(a));
    if (H5Tget_class(t) != H5T_STRING) rank_fail("HDF5: attribute " + name + " is not a string");
    if (H5Tis_variable_str(t) > 0) {
        char* s = nullptr;
        Handle mt = type(H5Tcopy(H5T_C_S1));
        H5Tset_size(mt, H5T_VARIABLE);
        check(H5Aread(a, mt, &s), "read attribute " + name);
        std::string out = s ? s : "";
        H5free_memory(s);
        return out;
    }
    size_t n = H5Tget_size(t);
    std::string out(n, '\0');
    check(H5Aread(a, t, out.data()), "read attribute " + name);
    while (!out.empty() && out.back() == '\0') out.pop_back();
    return out;
}

int64_t read_attr_i64(hid_t obj, const std::string& name) {
    Handle a = attr(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "open attribute " + name));
    int64_t v = 0;
    check(H5Aread(a, H5T_NATIVE_INT64, &v), "read attribute " + name);
    return v;
}

double read_attr_f64(hid_t obj, const std::string& name) {
    Handle a = attr(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "open attribute " + name));
    double v = 0;
    check(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "read attribute " + name);
    return v;
}

std::vector<std::string> child_names(hid_t loc, const std::string& group) {
    std::vector<std::string> out;
    Handle g = h5::group(check(H5Gopen2(loc, group.c_str(), H5P_DEFAULT), "open group " + group));
    H5G_info_t info;
    check(H5Gget_info(g, &info), "read group " + group);
    for (hsize_t i = 0; i < info.nlinks; ++i) {
        const ssize_t n = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
        if (n < 0) continue;
        std::string name(size_t(n) + 1, '\0');
        H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
        name.resize(size_t(n));
        out.push_back(name);
    }
    return out;
}

bool exists(hid_t loc, const std::string& path) {
    size_t pos = 0;
    while (true) {
        pos = path.find('/', pos + 1);
        std::string prefix = path.substr(0, pos);
        if (!prefix.empty() && prefix != "/" && H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0)
            return false;
        if (pos == std::string::npos) return true;
    }
}

hid_t create_groups(hid_t file, const std::string& path) {
    size_t pos = 0;
    while ((pos = path.find('/', pos + 1)) != std::string::npos) {
        std::string prefix = path.substr(0, pos);
        if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0)
            H5Gclose(check(H5Gcreate2(file, prefix.c_str(), H5P_DEFAULT, group_create_plist(), H5P_DEFAULT),
                           "create group " + prefix));
    }
    if (H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0) return check(H5Gopen2(file, path.c_str(), H5P_DEFAULT), "open group " + path);
    return check(H5Gcreate2(file, path.c_str(), H5P_DEFAULT, group_create_plist(), H5P_DEFAULT),
                 "create group " + path);
}

std::vector<hsize_t> dataset_shape(hid_t dset) {
    Handle s = space(H5Dget_space(dset));
    int nd = H5Sget_simple_extent_ndims(s);
    std::vector<hsize_t> dims(nd > 0 ? nd : 0);
    if (nd > 0) H5Sget_simple_extent_dims(s, dims.data(), nullptr);
    return dims;
}

}  // namespace quintet::h5
