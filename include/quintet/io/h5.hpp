// Small RAII wrappers over the HDF5 C API and the helpers the checkpoint, metrics and token
// files share. Every HDF5 call is checked; HDF5's own error-stack printing is switched off so
// users see our message (with the file name) instead of a library trace.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace quintet::h5 {

void silence_errors();

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
public:
    Handle() = default;
    Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
    ~Handle() { reset(); }
    Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
    Handle& operator=(Handle&& o) noexcept {
        if (this != &o) {
            reset();
            id_ = o.id_;
            close_ = o.close_;
            o.id_ = -1;
        }
        return *this;
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    hid_t get() const { return id_; }
    operator hid_t() const { return id_; }
    bool valid() const { return id_ >= 0; }
    hid_t release() {  // gives up ownership: the caller closes (and checks) the id
        hid_t id = id_;
        id_ = -1;
        return id;
    }
    void reset() {
        if (id_ >= 0 && close_) close_(id_);
        id_ = -1;
    }

private:
    hid_t id_ = -1;
    herr_t (*close_)(hid_t) = nullptr;
};

inline Handle file(hid_t id) { return Handle(id, H5Fclose); }
inline Handle dataset(hid_t id) { return Handle(id, H5Dclose); }
inline Handle space(hid_t id) { return Handle(id, H5Sclose); }
inline Handle group(hid_t id) { return Handle(id, H5Gclose); }
inline Handle plist(hid_t id) { return Handle(id, H5Pclose); }
inline Handle attr(hid_t id) { return Handle(id, H5Aclose); }
inline Handle type(hid_t id) { return Handle(id, H5Tclose); }

// Throws RankError("<what>: <context>") when id < 0.
hid_t check(hid_t id, const std::string& what);

// Creation property lists with HDF5's object time tracking off, for every file, group and dataset
// quintet creates: the same data written twice gives the same bytes (checksums of outputs hold).
Handle file_create_plist();
Handle group_create_plist();
Handle dataset_create_plist();

void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_i64(hid_t obj, const std::string& name, int64_t value);
void write_attr_f64(hid_t obj, const std::string& name, double value);
// A float64 dataset `name` under `loc` of shape `dims` (empty: 1-D of v.size()).
void write_f64(hid_t loc, const std::string& name, const std::vector<double>& v, const std::vector<hsize_t>& dims = {});
// Every value of the dataset at `path`, row-major, as double (empty when it does not exist).
std::vector<double> read_f64(hid_t loc, const std::string& path, std::vector<hsize_t>* dims = nullptr);
bool has_attr(hid_t obj, const std::string& name);
std::string read_attr_string(hid_t obj, const std::string& name);
int64_t read_attr_i64(hid_t obj, const std::string& name);
double read_attr_f64(hid_t obj, const std::string& name);
std::vector<std::string> child_names(hid_t loc, const std::string& group);  // the links in a group, by name
bool exists(hid_t loc, const std::string& path);  // every link along the path exists
hid_t create_groups(hid_t file, const std::string& path);  // mkdir -p of groups; returns the last
std::vector<hsize_t> dataset_shape(hid_t dset);

}  // namespace quintet::h5
